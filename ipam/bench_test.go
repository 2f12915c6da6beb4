package ipam

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// benchClock is a lock-free Clock, so the benchmarks measure the Manager
// rather than the fake clock's mutex.
type benchClock struct{ ns atomic.Int64 }

func (c *benchClock) Now() time.Time       { return time.Unix(0, c.ns.Load()) }
func (c *benchClock) Step(d time.Duration) { c.ns.Add(int64(d)) }

func benchManager(b *testing.B, cidr string, clk Clock, store Store) *Manager {
	b.Helper()
	m, err := NewManager(Config{
		Pool: "bench", Holder: "h", Ranges: mustRanges(b, RangeSpec{CIDR: cidr}),
		Cooldown: time.Second, PendingTTL: time.Hour,
		LowWatermark: 32, TargetFree: 128, HighWatermark: 4096,
		Store: store, Clock: clk,
	})
	if err != nil {
		b.Fatal(err)
	}
	return m
}

func tokens(n int) []string {
	t := make([]string, n)
	for i := range t {
		t[i] = fmt.Sprintf("tok-%06d", i)
	}
	return t
}

// steadyManager returns a recovered Manager of a /16 pool on a benchClock.
func steadyManager(b *testing.B) (*Manager, *benchClock) {
	b.Helper()
	clk := &benchClock{}
	m := benchManager(b, "10.0.0.0/16", clk, NewMemoryStore())
	if _, err := m.Recover(context.Background(), nil); err != nil {
		b.Fatal(err)
	}
	return m, clk
}

// allocReleaseOp returns one operation of the allocate-release benchmarks:
// allocate for the i-th of 4096 tokens, release it, move the clock 1ms.
func allocReleaseOp(b *testing.B, m *Manager, clk *benchClock) func(i int) {
	ctx := context.Background()
	toks := tokens(4096)
	return func(i int) {
		tok := toks[i&4095]
		a, err := m.Allocate(ctx, Reservation{Token: tok})
		if err != nil {
			b.Fatal(err)
		}
		if err := m.Release(a, Owner{Token: tok}); err != nil {
			b.Fatal(err)
		}
		clk.Step(time.Millisecond)
	}
}

// BenchmarkAllocateRelease is one allocate and one release on a /16 pool at
// steady state: the clock moves 1ms an operation against a 1s cooldown, so
// about a thousand addresses cycle through cooldown and back to the free
// list, and nothing touches the store.
func BenchmarkAllocateRelease(b *testing.B) {
	ctx := context.Background()
	m, clk := steadyManager(b)
	op := allocReleaseOp(b, m, clk)
	for i := range 20000 { // warm up to the steady state
		op(i)
		if i%64 == 0 {
			_ = m.Rebalance(ctx)
		}
	}
	writes := m.Stats().StoreWrites
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		op(i)
	}
	b.StopTimer()
	b.ReportMetric(float64(m.Stats().StoreWrites-writes)/float64(b.N), "writes/op")
}

// BenchmarkAllocateReleaseHot splits BenchmarkAllocateRelease in two, so
// that neither hides the other: ns/op and allocs/op are the hot path alone
// (allocate from the ready list, release into the cooldown), and the
// arming that keeps the ready list full runs with the timer stopped,
// reported per operation as arm-ns/op and writes/op, with the addresses
// each arming write makes ready (armed/write: the batch). Allocate never
// finds the ready list empty here, so it never writes.
//
// held=33000 first allocates 33,000 addresses that stay allocated, one
// replica's share of 100,000 VMs: each arming write then builds a block
// whose every offset is the Manager's, from a map of 33,000 entries.
func BenchmarkAllocateReleaseHot(b *testing.B) {
	for _, held := range []int{0, 33000} {
		b.Run(fmt.Sprintf("held=%d", held), func(b *testing.B) { benchAllocateReleaseHot(b, held) })
	}
}

func benchAllocateReleaseHot(b *testing.B, held int) {
	ctx := context.Background()
	m, clk := steadyManager(b)
	readyCount := func() int {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.readyList.n
	}
	for i := range held {
		if _, err := m.Allocate(ctx, Reservation{Token: fmt.Sprintf("held-%06d", i)}); err != nil {
			b.Fatal(err)
		}
	}
	var armTime time.Duration
	var armed int
	// refill arms, as the background would, once the ready list is down
	// to a batch: every allocation after it finds an armed address.
	refill := func() {
		before := readyCount()
		start := time.Now()
		for range 8 {
			if err := m.Rebalance(ctx); err != nil {
				b.Fatal(err)
			}
			if readyCount() > before {
				break
			}
		}
		armTime += time.Since(start)
		armed += readyCount() - before
	}
	op := allocReleaseOp(b, m, clk)
	low := m.armBatchLocked(clk.Now())
	for i := range 20000 { // warm up to the steady state
		if readyCount() <= low {
			refill()
		}
		op(i)
	}
	armTime, armed = 0, 0
	writes := m.Stats().StoreWrites
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if readyCount() <= low {
			b.StopTimer()
			refill()
			b.StartTimer()
		}
		op(i)
	}
	b.StopTimer()
	w := m.Stats().StoreWrites - writes
	b.ReportMetric(float64(armTime.Nanoseconds())/float64(b.N), "arm-ns/op")
	b.ReportMetric(float64(w)/float64(b.N), "writes/op")
	if w > 0 {
		b.ReportMetric(float64(armed)/float64(w), "armed/write")
	}
}

// BenchmarkAllocateParallel is allocate+release from 32 goroutines at once.
func BenchmarkAllocateParallel(b *testing.B) {
	ctx := context.Background()
	clk := &benchClock{}
	m := benchManager(b, "10.0.0.0/16", clk, NewMemoryStore())
	if _, err := m.Recover(ctx, nil); err != nil {
		b.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go m.Run(runCtx, 10*time.Millisecond, nil)
	var g atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(32 / runtime.GOMAXPROCS(0))
	b.RunParallel(func(pb *testing.PB) {
		toks := tokens(1024)
		id := g.Add(1)
		for i := range toks {
			toks[i] = fmt.Sprintf("g%d-%s", id, toks[i])
		}
		for i := 0; pb.Next(); i++ {
			tok := toks[i&1023]
			a, err := m.Allocate(ctx, Reservation{Token: tok})
			if err != nil {
				b.Error(err)
				return
			}
			if err := m.Release(a, Owner{Token: tok}); err != nil {
				b.Error(err)
				return
			}
			clk.Step(time.Millisecond / 32)
		}
	})
}

// liveOn returns n holdings on consecutive addresses from start.
func liveOn(start string, n int) []Holding {
	live := make([]Holding, n)
	a := netip.MustParseAddr(start)
	for i := range live {
		a = a.Next()
		live[i] = Holding{Addr: a, Owner: Owner{Token: fmt.Sprintf("t%d", i), UID: fmt.Sprintf("uid-%d", i)}}
	}
	return live
}

// BenchmarkRecover100k rebuilds a Manager from a store and 100,000 live
// machines, as after a restart (goal: under 1s).
func BenchmarkRecover100k(b *testing.B) {
	ctx := context.Background()
	clk := &benchClock{}
	store := NewMemoryStore()
	live := liveOn("10.0.0.0", 100_000)
	seed := benchManager(b, "10.0.0.0/12", clk, store)
	if _, err := seed.Recover(ctx, live); err != nil {
		b.Fatal(err)
	}
	if err := seed.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		m := benchManager(b, "10.0.0.0/12", clk, store)
		rep, err := m.Recover(ctx, live)
		if err != nil || rep.Allocated != len(live) {
			b.Fatalf("recover: %+v %v", rep, err)
		}
	}
}

// BenchmarkResync33k reconciles a Manager with the 33,334 live machines it
// holds addresses for, as each replica's resync does at 100,000 VMs over
// three replicas: the whole call holds the lock allocations take, except
// for the set of UIDs, built before it.
func BenchmarkResync33k(b *testing.B) {
	ctx := context.Background()
	clk := &benchClock{}
	live := liveOn("10.0.0.0", 33_334)
	m := benchManager(b, "10.0.0.0/12", clk, NewMemoryStore())
	if _, err := m.Recover(ctx, live); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		rep := m.Resync(live, m.Mark())
		if rep.Released != 0 || rep.Adopted != 0 || len(rep.Conflicts) != 0 {
			b.Fatalf("resync changed what it should not: %+v", rep)
		}
	}
}

// BenchmarkMemoryPerAddress reports the heap a claimed address costs.
func BenchmarkMemoryPerAddress(b *testing.B) {
	ctx := context.Background()
	const n = 100_000
	live := liveOn("10.0.0.0", n)
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		m := benchManager(b, "10.0.0.0/12", &benchClock{}, NewMemoryStore())
		if _, err := m.Recover(ctx, live); err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "bytes/address")
		runtime.KeepAlive(m)
	}
}

// BenchmarkPersistedSize reports what a full pool costs in the store: every
// address claimed, and the worst case of every address cooling down.
func BenchmarkPersistedSize(b *testing.B) {
	for _, tc := range []struct{ name, cidr string }{{"slash16", "10.0.0.0/16"}, {"slash12", "10.0.0.0/12"}} {
		b.Run(tc.name, func(b *testing.B) {
			ctx := context.Background()
			p := netip.MustParsePrefix(tc.cidr)
			n := 1<<(32-p.Bits()) - 2
			for b.Loop() {
				store := NewMemoryStore()
				clk := &benchClock{}
				m := benchManager(b, tc.cidr, clk, store)
				live := liveOn("10.0.0.0", n)
				if _, err := m.Recover(ctx, live); err != nil {
					b.Fatal(err)
				}
				if err := m.Flush(ctx); err != nil {
					b.Fatal(err)
				}
				total, largest, objects := storeSize(b, store)
				b.ReportMetric(float64(objects), "objects")
				b.ReportMetric(float64(total), "bytes-claimed")
				b.ReportMetric(float64(largest), "max-object-bytes-claimed")
				for _, h := range live {
					if err := m.Release(h.Addr, h.Owner); err != nil {
						b.Fatal(err)
					}
				}
				if err := m.Flush(ctx); err != nil {
					b.Fatal(err)
				}
				total, largest, _ = storeSize(b, store)
				b.ReportMetric(float64(total), "bytes-all-cooling")
				b.ReportMetric(float64(largest), "max-object-bytes-all-cooling")
			}
		})
	}
}

func storeSize(b *testing.B, s *MemoryStore) (total, largest, objects int) {
	blocks, _ := s.List(context.Background())
	for _, bl := range blocks {
		raw, err := json.Marshal(bl.Encode())
		if err != nil {
			b.Fatal(err)
		}
		total += len(raw)
		largest = max(largest, len(raw))
	}
	return total, largest, len(blocks)
}

// BenchmarkFull12 is a /12 pool whose every usable address is allocated:
// a failing Allocate, a Lookup, and a Snapshot (what a metrics scrape or a
// status write takes), each alone and while failing allocations run
// concurrently. None may walk the pool (goal: microseconds).
func BenchmarkFull12(b *testing.B) {
	ctx := context.Background()
	clk := &benchClock{}
	m := benchManager(b, "10.0.0.0/12", clk, NewMemoryStore())
	n := int(m.Ranges().Size())
	live := liveOn("10.0.0.0", n)
	if _, err := m.Recover(ctx, live); err != nil {
		b.Fatal(err)
	}
	if c := m.Snapshot(); c.Allocated != n {
		b.Fatalf("recovered %+v, want %d allocated", c, n)
	}
	a := live[n/2].Addr
	b.Run("failing Allocate", func(b *testing.B) {
		for b.Loop() {
			if _, err := m.Allocate(ctx, Reservation{Token: "one too many"}); err == nil {
				b.Fatal("allocated from a full pool")
			}
		}
	})
	b.Run("Snapshot", func(b *testing.B) {
		for b.Loop() {
			m.Snapshot()
		}
	})
	b.Run("Lookup while allocations fail", func(b *testing.B) {
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
					_, _ = m.Allocate(ctx, Reservation{Token: "one too many"})
				}
			}
		}()
		for b.Loop() {
			m.Lookup(a)
		}
		close(stop)
		<-done
	})
}
