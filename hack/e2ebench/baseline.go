package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Static ranges outside every vmipam pool, in the benchmarking block
// 198.18.0.0/15 and, for the no-op mutating webhook, in the shared address space
// 100.64.0.0/10: vmipam's controller leaves objects with these addresses
// alone ("outside every pool: not ours to manage").
var (
	withoutRange  = netip.MustParsePrefix("198.18.0.0/16")
	baselineRange = netip.MustParsePrefix("198.19.0.0/16")
	noopRange     = netip.MustParsePrefix("100.64.0.0/16")
	staticRanges  = []netip.Prefix{withoutRange, baselineRange, noopRange}
)

// staticRange is how many addresses each static range offers.
const staticRange = 1<<16 - 2

// nthAddr returns the i-th host address (from 0) of an IPv4 prefix.
func nthAddr(p netip.Prefix, i int) netip.Addr {
	b := p.Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(i) + 1
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// Where the baseline keeps its state: one object holding every allocation,
// as whereabouts keeps one IPPool resource per range.
const (
	baselinePool  = "whereabouts-pool"
	allocationKey = "allocations"
	// maxAttempts bounds the read-modify-write retries of one allocation.
	maxAttempts = 10000
)

// baseline allocates the way whereabouts-style IPAM does: read the one
// pool object, pick the first free address of the range, write the object
// back under its resourceVersion, and start again on a conflict.
type baseline struct {
	prefix    netip.Prefix
	attempts  atomic.Int64
	conflicts atomic.Int64
}

// reset empties the pool object, creating it if needed.
func (bl *baseline) reset(ctx context.Context, c client.Client) error {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: nsBaseline, Name: baselinePool}}
	data := map[string]string{"range": bl.prefix.String(), allocationKey: "{}"}
	err := c.Get(ctx, client.ObjectKeyFromObject(cm), cm)
	switch {
	case apierrors.IsNotFound(err):
		cm.Data = data
		err = c.Create(ctx, cm)
	case err == nil:
		cm.Data = data
		err = c.Update(ctx, cm)
	}
	if err != nil {
		return fmt.Errorf("reset the baseline's pool object: %w", err)
	}
	bl.attempts.Store(0)
	bl.conflicts.Store(0)
	return nil
}

// allocate reserves the first free address for owner.
func (bl *baseline) allocate(ctx context.Context, c client.Client, owner string) (netip.Addr, error) {
	key := client.ObjectKey{Namespace: nsBaseline, Name: baselinePool}
	for range maxAttempts {
		bl.attempts.Add(1)
		var cm corev1.ConfigMap
		if err := c.Get(ctx, key, &cm); err != nil {
			return netip.Addr{}, fmt.Errorf("read the pool object: %w", err)
		}
		allocs := map[string]string{}
		if err := json.Unmarshal([]byte(cm.Data[allocationKey]), &allocs); err != nil {
			return netip.Addr{}, fmt.Errorf("decode the allocations: %w", err)
		}
		var addr netip.Addr
		for i := range staticRange {
			if a := nthAddr(bl.prefix, i); allocs[a.String()] == "" {
				addr = a
				break
			}
		}
		if !addr.IsValid() {
			return netip.Addr{}, fmt.Errorf("range %s is full", bl.prefix)
		}
		allocs[addr.String()] = owner
		raw, err := json.Marshal(allocs)
		if err != nil {
			return netip.Addr{}, err
		}
		cm.Data[allocationKey] = string(raw)
		switch err := c.Update(ctx, &cm); {
		case err == nil:
			return addr, nil
		case apierrors.IsConflict(err):
			bl.conflicts.Add(1)
		default:
			return netip.Addr{}, fmt.Errorf("write the pool object: %w", err)
		}
	}
	return netip.Addr{}, fmt.Errorf("no allocation after %d conflicting attempts", maxAttempts)
}
