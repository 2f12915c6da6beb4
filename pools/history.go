package pools

import (
	"context"

	"github.com/go-logr/logr"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
)

// Recorder stores the history of addresses: history.Writer is one.
type Recorder interface {
	// Record returns once recs are stored.
	Record(ctx context.Context, recs ...vmipamv1.AddressRecord) error
}

// Record stores recs in the address history and returns once they are;
// without a history (Options.History) it does nothing. The garbage
// collector records an object's tenure before it removes the object's
// finalizer, so that a crash between the two loses no record: the
// release is made again, and recorded again, which reads as once.
func (r *Registry) Record(ctx context.Context, recs ...vmipamv1.AddressRecord) error {
	if r.opts.History == nil || len(recs) == 0 {
		return nil
	}
	for i := range recs {
		if recs[i].Holder == "" {
			recs[i].Holder = r.opts.Holder
		}
	}
	return r.opts.History.Record(ctx, recs...)
}

// LogAssigned and LogReleased write the one info line per assignment and
// release of an address, with stable field names, for log pipelines that
// keep more history than the cluster does: event ("assigned",
// "released"), address, pool, kind (Kind.group), namespace, name, uid,
// holder; a release adds ended (the state left, as in AddressRecord) and,
// for a cooldown, coolsDownUntil.
func (r *Registry) LogAssigned(log logr.Logger, rec vmipamv1.AddressRecord) {
	log.Info("Address assigned", "event", "assigned", "address", rec.Address, "pool", rec.Pool, "kind", rec.Kind,
		"namespace", rec.Namespace, "name", rec.Name, "uid", rec.UID, "holder", r.opts.Holder)
}

// LogReleased writes the info line for a release: the fields of
// LogAssigned, ended, and the extra key-value pairs kv.
func (r *Registry) LogReleased(log logr.Logger, rec vmipamv1.AddressRecord, kv ...any) {
	log.Info("Address released", append([]any{"event", "released", "address", rec.Address, "pool", rec.Pool, "kind", rec.Kind,
		"namespace", rec.Namespace, "name", rec.Name, "uid", rec.UID, "holder", r.opts.Holder, "ended", rec.Ended}, kv...)...)
}
