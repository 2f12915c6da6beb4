// Package app wires vmipam's parts into a controller-runtime manager: the
// pool registry, the controllers, the webhooks and the health checks. The
// vmipam binary and the integration tests call the same Setup, so what the
// tests prove is what ships.
package app

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/controller"
	"github.com/vmipam/vmipam/history"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/kinds/rawwatch"
	"github.com/vmipam/vmipam/metrics"
	"github.com/vmipam/vmipam/pools"
	"github.com/vmipam/vmipam/webhook"
	"github.com/vmipam/vmipam/webhook/transport"
)

// Options configure Setup.
type Options struct {
	// Holder names this replica in the pools' claims: stable across its
	// restarts, used by one process at a time (the pod's name).
	Holder string
	// Namespace is vmipam's own namespace, where the holder Leases live.
	Namespace string
	// Lease times the holder Lease; zero fields take the defaults.
	Lease pools.LeaseOptions
	// Slot, if set, is the holder slot this process took: Holder is its
	// Holder (see pools.Options.Slot).
	Slot *pools.Slot
	// Kinds are the kinds given addresses (the kinds configuration);
	// empty means vmipam's own VirtualMachine.
	Kinds []kinds.Kind
	// Clock defaults to the system clock.
	Clock ipam.Clock
	// RunInterval, ResyncInterval, FullResyncInterval, StatusInterval and
	// ProveInterval: see pools.Options.
	RunInterval, ResyncInterval, FullResyncInterval, StatusInterval, ProveInterval time.Duration
	// MaxConcurrentReconciles of the address garbage collector.
	MaxConcurrentReconciles int
	// Limits bound what one admission request may cost.
	Limits transport.Limits
	// History configures the address history; History.Off records none.
	History HistoryOptions
	// Draining, when set, reports that the process is shutting down: the
	// replica then reports not ready, so that the Service sends admissions
	// to the other replicas.
	Draining func() bool
}

// HistoryOptions configure the address history (package history).
type HistoryOptions struct {
	// Off records no history.
	Off bool
	// Keep and Retention bound what is kept of each address; zero takes
	// history.DefaultKeep and history.DefaultRetention.
	Keep      int
	Retention time.Duration
}

// CacheOptions returns the manager's informer cache options: Secrets and
// Leases only in vmipam's own namespace, which is all RBAC grants. The
// objects of the configured kinds come through caches of their own, made
// once the API server serves the kind (see kindCaches).
func CacheOptions(namespace string) cache.Options {
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&corev1.Secret{}:        {Namespaces: map[string]cache.Config{namespace: {}}},
		&coordinationv1.Lease{}: {Namespaces: map[string]cache.Config{namespace: {}}},
	}}
}

// kindCaches makes and adds to mgr the two caches of kind t a replica
// watches, both trimmed to what vmipam reads: the objects labelled for
// replica holder (see vmipamv1.HolderLabel), and those with no holder
// label (that bypassed the webhook, or were created before vmipam labelled
// them; every replica sees them, and the one that holds an address, or is
// chosen for one that needs one, labels it). An object labelled for
// another replica is in neither. The replica's own objects, which vmipam
// stamped, are watched as metadata only where that suffices
// (kinds.Kind.MetadataSuffices; shardReader reads them); the others
// whole, trimmed (kinds.Kind.Trim), since an object that bypassed the
// webhook may hold its address anywhere and its kind's condition may read
// its spec. The objects watched whole are decoded straight into what Trim
// keeps (kinds.Kind.DecodeTrimmed, through package rawwatch), not whole
// into maps and then trimmed.
func kindCaches(mgr ctrl.Manager, t kinds.Kind, holder string) (own, unlabeled cache.Cache, err error) {
	unlabelled, err := pools.Unlabelled()
	if err != nil {
		return nil, nil, err
	}
	ownObj, ownTrim := client.Object(t.New()), toolscache.TransformFunc(nil)
	if t.MetadataSuffices() {
		ownObj, ownTrim = t.NewMetadata(), t.TrimOwn(pools.HolderLabelValue(holder))
	}
	for _, sel := range []struct {
		dst  *cache.Cache
		sel  labels.Selector
		obj  client.Object
		trim toolscache.TransformFunc
	}{
		{&own, labels.SelectorFromSet(labels.Set{vmipamv1.HolderLabel: pools.HolderLabelValue(holder)}), ownObj, ownTrim},
		{&unlabeled, unlabelled, t.New(), nil},
	} {
		opts := cache.Options{
			HTTPClient: mgr.GetHTTPClient(), Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
			ByObject: map[client.Object]cache.ByObject{sel.obj: {Label: sel.sel, Transform: sel.trim}},
		}
		if sel.trim == nil {
			// Watched whole: decoded straight into what Trim keeps
			// (kinds.Kind.DecodeTrimmed), instead of whole into maps by
			// the dynamic client, then trimmed.
			lw, err := rawwatch.New(mgr.GetConfig(), mgr.GetHTTPClient(), t.GVR(), sel.sel, t.DecodeTrimmed)
			if err != nil {
				return nil, nil, err
			}
			opts.NewInformer = func(crlw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, idx toolscache.Indexers) toolscache.SharedIndexInformer {
				if u, ok := obj.(*unstructured.Unstructured); ok && u.GroupVersionKind() == t.GVK {
					// This cache's one informer: lw applies the
					// selector that controller-runtime's would.
					return toolscache.NewSharedIndexInformer(lw, obj, resync, idx)
				}
				return toolscache.NewSharedIndexInformer(crlw, obj, resync, idx)
			}
		}
		c, err := cache.New(mgr.GetConfig(), opts)
		if err != nil {
			return nil, nil, fmt.Errorf("make a cache of %s: %w", t.GVR().GroupResource(), err)
		}
		if err := mgr.Add(c); err != nil {
			return nil, nil, fmt.Errorf("add a cache of %s: %w", t.GVR().GroupResource(), err)
		}
		*sel.dst = c
	}
	return own, unlabeled, nil
}

// holderOr returns holder, or the default holder when it is empty.
func holderOr(holder string) string {
	if holder == "" {
		return "vmipam"
	}
	return holder
}

// Setup adds the pool registry, the controllers, the webhooks and the
// health checks to mgr and returns the registry.
func Setup(mgr ctrl.Manager, opts Options) (*pools.Registry, error) {
	ts := kinds.OrDefault(opts.Kinds)
	opts.Holder = holderOr(opts.Holder)
	lease := opts.Lease
	lease.Namespace = opts.Namespace
	if lease.Namespace == "" {
		lease.Namespace = "vmipam-system"
	}
	var rec pools.Recorder
	if !opts.History.Off {
		w := history.NewWriter(mgr.GetClient(), mgr.GetAPIReader())
		w.Keep, w.Retention = opts.History.Keep, opts.History.Retention
		rec = w
	}
	reg := pools.NewRegistry(pools.Options{
		History: rec,
		Client:  mgr.GetClient(), APIReader: mgr.GetAPIReader(), Kinds: ts, Holder: opts.Holder, Clock: opts.Clock,
		Lease: lease, Slot: opts.Slot, Informers: mgr.GetCache(),
		RunInterval: opts.RunInterval, ResyncInterval: opts.ResyncInterval, FullResyncInterval: opts.FullResyncInterval, StatusInterval: opts.StatusInterval, ProveInterval: opts.ProveInterval,
		Recorder:          mgr.GetEventRecorder("vmipam"),
		ObserveAllocation: metrics.ObserveAllocation, NoteDuplicate: metrics.NoteDuplicate, ObserveResync: metrics.ObserveResync,
	})
	metrics.Register(reg)
	if err := mgr.Add(reg); err != nil {
		return nil, fmt.Errorf("add pool registry: %w", err)
	}
	if err := (&controller.IPPoolReconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Registry: reg, Recorder: mgr.GetEventRecorder("vmipam"), Clock: opts.Clock,
	}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up IPPool controller: %w", err)
	}
	if err := (&controller.IPReleaseReconciler{Client: mgr.GetClient(), Registry: reg}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up IPRelease controller: %w", err)
	}
	handlers := map[string]struct {
		name    string
		handler admission.Handler
	}{
		webhook.IPPoolValidatorPath: {"ippool-validating", webhook.NewIPPoolValidator(mgr.GetAPIReader(), mgr.GetScheme())},
	}
	for _, t := range ts {
		// What the controller and the webhook read of the objects: this
		// replica's, and the unlabelled ones, once the kind is served.
		objects := &shardReader{kind: t, api: mgr.GetAPIReader(), holder: pools.HolderLabelValue(opts.Holder)}
		reg.SetCached(t.GVK, objects)
		if err := whenServed(mgr, t, func(mgr ctrl.Manager) error {
			reg.MarkServed(t.GVK)
			own, unlabeled, err := kindCaches(mgr, t, opts.Holder)
			if err != nil {
				return err
			}
			objects.set(own, unlabeled)
			if err := objects.setIndexes(context.Background(), own, unlabeled); err != nil {
				return fmt.Errorf("index the caches of %s: %w", t.GVR().GroupResource(), err)
			}
			return (&controller.AddressGC{
				Client: mgr.GetClient(), Reader: objects, Own: own, Unlabeled: unlabeled, APIReader: mgr.GetAPIReader(), Registry: reg, Kind: t,
				Recorder: mgr.GetEventRecorder("vmipam"), MaxConcurrentReconciles: opts.MaxConcurrentReconciles, Clock: opts.Clock,
			}).SetupWithManager(mgr)
		}); err != nil {
			return nil, err
		}
		name := t.Resource + "." + t.GVK.Group + "-mutating"
		if t.GVR() == kinds.VirtualMachine.GVR() {
			name = "virtualmachine-mutating"
			// Earlier versions' ValidatingWebhookConfiguration calls it;
			// served for an upgrade from one (see webhook.StampGuard).
			handlers[webhook.StampGuardPath] = struct {
				name    string
				handler admission.Handler
			}{"virtualmachine-validating", &webhook.StampGuard{Kind: t}}
		}
		handlers[webhook.MutatePath(t)] = struct {
			name    string
			handler admission.Handler
		}{name, &webhook.Assigner{Registry: reg, Kind: t, Names: objects}}
	}
	srv := mgr.GetWebhookServer()
	// One Reviews for all webhooks, so its bounds on memory and
	// concurrency hold for them together.
	reviews := transport.NewReviews(opts.Limits)
	for path, h := range handlers {
		srv.Register(path, metrics.InstrumentHTTP(path, reviews.Handler(metrics.InstrumentAdmission(h.name, h.handler))))
	}
	if err := mgr.AddHealthzCheck("ping", func(*http.Request) error { return nil }); err != nil {
		return nil, fmt.Errorf("add healthz check: %w", err)
	}
	if err := mgr.AddReadyzCheck("webhook", srv.StartedChecker()); err != nil {
		return nil, fmt.Errorf("add readyz check: %w", err)
	}
	if d := opts.Draining; d != nil {
		if err := mgr.AddReadyzCheck("draining", func(*http.Request) error {
			if d() {
				return errors.New("shutting down")
			}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("add readyz check: %w", err)
		}
	}
	if err := mgr.AddReadyzCheck("pools", func(req *http.Request) error { return reg.Serving(req.Context()) }); err != nil {
		return nil, fmt.Errorf("add readyz check: %w", err)
	}
	return reg, nil
}
