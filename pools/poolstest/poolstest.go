// Package poolstest starts pool registries for the unit tests of the
// packages that build on pools: over a client the test gives (a fake one,
// narrowly), with the periodic loops slowed to an hour so that the test
// drives them. A Rig is such a registry over a fake API server whose
// answers the test forces, with the VirtualMachines and the stale cache
// the tests of the layers above pools need. It is for tests only, and
// imports none of those layers.
package poolstest

import (
	"context"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/vmipam/vmipam/api/scheme"
	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/pools"
)

// Start returns a Registry of vmipam's own kind for holder over c (its
// client and its API reader), on clock clk, started until the test ends,
// with each of ps recovered.
func Start(t testing.TB, c client.Client, clk ipam.Clock, holder string, ps ...*vmipamv1.IPPool) *pools.Registry {
	t.Helper()
	return start(t, pools.Options{Client: c, APIReader: c, Kinds: kinds.Default(), Holder: holder, Clock: clk}, ps...)
}

// StartWith is Start with opts (its clients, clock and holder among
// them), whose periodic loops it slows to an hour.
func StartWith(t testing.TB, opts pools.Options, ps ...*vmipamv1.IPPool) *pools.Registry {
	t.Helper()
	return start(t, opts, ps...)
}

// start is Start with opts, whose periodic loops it slows to an hour.
func start(t testing.TB, opts pools.Options, ps ...*vmipamv1.IPPool) *pools.Registry {
	t.Helper()
	opts.RunInterval, opts.ResyncInterval, opts.StatusInterval = time.Hour, time.Hour, time.Hour
	reg := pools.NewRegistry(opts)
	ctx, stop := context.WithCancel(context.Background())
	var done sync.WaitGroup
	done.Go(func() { _ = reg.Start(ctx) })
	t.Cleanup(func() { stop(); done.Wait() })
	for _, p := range ps {
		if err := reg.Ensure(t.Context(), p); err != nil {
			t.Fatalf("recover IPPool %s: %v", p.Name, err)
		}
	}
	return reg
}

// StartUnseen returns a Registry of vmipam's own kind over api, on clock
// clk, serving once started, whose cache of IPPools has seen none of
// those in api: a pool created a moment before it was needed. Every
// other read of the cache is api's.
func StartUnseen(t testing.TB, api client.WithWatch, clk ipam.Clock) *pools.Registry {
	t.Helper()
	noPools := fake.NewClientBuilder().WithScheme(scheme.Scheme).Build()
	cache := interceptor.NewClient(api, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*vmipamv1.IPPool); ok {
				return noPools.Get(ctx, key, obj, opts...)
			}
			return c.Get(ctx, key, obj, opts...)
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, ok := list.(*vmipamv1.IPPoolList); ok {
				return noPools.List(ctx, list, opts...)
			}
			return c.List(ctx, list, opts...)
		},
	})
	reg := start(t, pools.Options{Client: cache, APIReader: api, Kinds: kinds.Default(), Holder: "vmipam", Clock: clk})
	for deadline := time.Now().Add(10 * time.Second); reg.Serving(t.Context()) != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not serving after 10s: %v", reg.Serving(t.Context()))
		}
	}
	return reg
}
