package app

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/metrics"
)

// crdPollInterval is how often vmipam looks again for the CRD of a
// configured kind that is not installed.
const crdPollInterval = 10 * time.Second

// whenServed runs setup (the kind's controller) now if the API server
// serves kind t, and otherwise once it does: a kind in the configuration
// whose CRD is not installed yet is waited for, with an error in the log
// naming the CRD and the fix, and vmipam_kind_served at 0, while vmipam
// serves the other kinds. Until then no object of the kind exists, so no
// admission of it can come and no pool holds an address for it.
func whenServed(mgr ctrl.Manager, t kinds.Kind, setup func(ctrl.Manager) error) error {
	served := func() (bool, error) {
		_, err := mgr.GetRESTMapper().RESTMapping(t.GVK.GroupKind(), t.GVK.Version)
		switch {
		case err == nil:
			return true, nil
		case meta.IsNoMatchError(err):
			return false, nil
		}
		return false, fmt.Errorf("look up %s: %w", t.GVR(), err)
	}
	ok, err := served()
	if err == nil && ok {
		metrics.SetKindServed(t.GVK, true)
		if err := setup(mgr); err != nil {
			return fmt.Errorf("set up the address controller of %s: %w", t.GVR().GroupResource(), err)
		}
		return nil
	}
	metrics.SetKindServed(t.GVK, false)
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		log := ctrl.Log.WithName("kinds")
		tick := time.NewTicker(crdPollInterval)
		defer tick.Stop()
		var lastLog time.Time
		for {
			ok, err := served()
			switch {
			case ok:
				if err := setup(mgr); err != nil {
					return fmt.Errorf("set up the address controller of %s: %w", t.GVR().GroupResource(), err)
				}
				metrics.SetKindServed(t.GVK, true)
				log.Info("Serving kind: its CRD is installed", "kind", t.GVK.String(), "resource", t.GVR().GroupResource().String())
				return nil
			case time.Since(lastLog) >= time.Minute:
				lastLog = time.Now()
				log.Error(err, "Kind in the kinds configuration is not served by the API server; waiting for its CRD",
					"kind", t.GVK.String(), "crd", t.GVR().GroupResource().String(),
					"fix", "install the CRD "+t.GVR().GroupResource().String()+" (version "+t.GVK.Version+"), or remove the kind from --kinds-config")
			}
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
			}
		}
	}))
}
