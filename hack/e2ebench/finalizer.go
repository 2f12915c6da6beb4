package main

import (
	"context"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vmipam/vmipam/api/scheme"
	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
)

// noopFinalizer is the finalizer the no-op mutating webhook adds and the
// no-op finalizer remover takes away. With it, a delete in nsNoop costs
// what any finalizer costs (the DELETE marks the object, a controller
// patches the finalizer away, the API server removes the object): the
// floor of a delete through vmipam, whose controller does that and
// releases the address.
const noopFinalizer = "e2ebench.vmipam.io/noop"

// finalizerWorkers is how many patches the remover has in flight, as
// vmipam's controller has reconciles (MaxConcurrentReconciles).
const finalizerWorkers = 16

// finalizerRemover watches the VirtualMachines of nsNoop and removes
// noopFinalizer from each one being deleted, with an optimistically
// locked merge patch as vmipam's controller removes its own: a watch
// whose last version of each object stands in for the cache, a queue
// without duplicates, and finalizerWorkers workers. A patch that loses to
// a newer version is made again when the watch shows that version.
type finalizerRemover struct {
	c client.WithWatch

	mu sync.Mutex
	// latest is the last version the watch showed of each queued name.
	latest  map[string]*vmipamv1.VirtualMachine
	pending []string
	wake    chan struct{}
}

// startFinalizerRemover runs a remover in this program until ctx ends.
func (b *bench) startFinalizerRemover(ctx context.Context) error {
	c, err := client.NewWithWatch(b.cl.Config, client.Options{Scheme: scheme.Scheme, Mapper: b.cl.Client.RESTMapper()})
	if err != nil {
		return err
	}
	startRemover(ctx, c)
	return nil
}

// startRemover runs a remover with c until ctx ends.
func startRemover(ctx context.Context, c client.WithWatch) {
	f := &finalizerRemover{c: c, latest: map[string]*vmipamv1.VirtualMachine{}, wake: make(chan struct{}, 1)}
	go f.watch(ctx)
	for range finalizerWorkers {
		go f.work(ctx)
	}
}

// watch queues every object being deleted that carries the finalizer,
// listing again whenever the watch ends.
func (f *finalizerRemover) watch(ctx context.Context) {
	for ctx.Err() == nil {
		var list vmipamv1.VirtualMachineList
		if err := f.c.List(ctx, &list, client.InNamespace(nsNoop)); err != nil {
			sleepCtx(ctx, time.Second)
			continue
		}
		for i := range list.Items {
			f.offer(&list.Items[i])
		}
		w, err := f.c.Watch(ctx, &vmipamv1.VirtualMachineList{},
			&client.ListOptions{Namespace: nsNoop, Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
		if err != nil {
			sleepCtx(ctx, time.Second)
			continue
		}
		for ev := range w.ResultChan() {
			if vm, ok := ev.Object.(*vmipamv1.VirtualMachine); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
				f.offer(vm)
			}
		}
		w.Stop()
	}
}

// offer queues vm's name if it is being deleted and carries the finalizer.
func (f *finalizerRemover) offer(vm *vmipamv1.VirtualMachine) {
	if vm.DeletionTimestamp == nil || !slices.Contains(vm.Finalizers, noopFinalizer) {
		return
	}
	f.mu.Lock()
	if f.latest[vm.Name] == nil {
		f.pending = append(f.pending, vm.Name)
	}
	f.latest[vm.Name] = vm.DeepCopy()
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// next takes an object off the queue, waiting for one until ctx ends.
func (f *finalizerRemover) next(ctx context.Context) (*vmipamv1.VirtualMachine, bool) {
	for {
		f.mu.Lock()
		if len(f.pending) > 0 {
			name := f.pending[0]
			f.pending = f.pending[1:]
			vm := f.latest[name]
			delete(f.latest, name)
			more := len(f.pending) > 0
			f.mu.Unlock()
			if more {
				select {
				case f.wake <- struct{}{}:
				default:
				}
			}
			return vm, true
		}
		f.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, false
		case <-f.wake:
		}
	}
}

// work removes the finalizer of each object it takes.
func (f *finalizerRemover) work(ctx context.Context) {
	for {
		vm, ok := f.next(ctx)
		if !ok {
			return
		}
		base := vm.DeepCopy()
		vm.Finalizers = slices.DeleteFunc(vm.Finalizers, func(s string) bool { return s == noopFinalizer })
		// A conflict needs nothing: the watch brings the newer version and
		// queues it again. Any other failure is tried again with what the
		// watch shows by then.
		err := f.c.Patch(ctx, vm, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			sleepCtx(ctx, 100*time.Millisecond)
			f.offer(base)
		}
	}
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
