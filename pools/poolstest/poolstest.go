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
