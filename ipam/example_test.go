package ipam_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vmipam/vmipam/ipam"
)

// stepClock is a Clock the example moves by hand.
type stepClock struct{ t time.Time }

func (c *stepClock) Now() time.Time { return c.t }

func Example() {
	ctx := context.Background()
	ranges, err := ipam.ParseRanges([]ipam.RangeSpec{{CIDR: "10.0.0.0/29", Exclude: []string{"10.0.0.2"}}})
	if err != nil {
		panic(err)
	}
	clock := &stepClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	m, err := ipam.NewManager(ipam.Config{
		Pool: "example", Holder: "replica-0", Ranges: ranges,
		Cooldown: time.Minute, PendingTTL: 30 * time.Second,
		Store: ipam.NewMemoryStore(), Clock: clock,
	})
	if err != nil {
		panic(err)
	}
	// Recover from the store and the addresses on live machines (none yet).
	if _, err := m.Recover(ctx, nil); err != nil {
		panic(err)
	}

	// The webhook reserves an address under a fresh token...
	a, _ := m.Allocate(ctx, ipam.Reservation{Token: "token-1"})
	fmt.Println("reserved", a)
	// ...the controller binds it once the cluster has stored the machine...
	if _, err := m.Bind(ipam.Owner{Token: "token-1", UID: "uid-1"}); err != nil {
		panic(err)
	}
	// ...and releases it when the machine is deleted.
	if err := m.Release(a, ipam.Owner{UID: "uid-1"}); err != nil {
		panic(err)
	}
	state, _, until := m.Lookup(a)
	fmt.Println(a, state, "until", until.Format(time.TimeOnly))

	// A static request for the cooling address is refused with the reason.
	err = m.Reserve(ctx, ipam.Reservation{Token: "token-2"}, a)
	fmt.Println(errors.Is(err, ipam.ErrCoolingDown), err)
	// Output:
	// reserved 10.0.0.1
	// 10.0.0.1 cooldown until 00:01:00
	// true reserve in pool "example": address 10.0.0.1 was released recently and cools down until 2026-01-01T00:01:00Z
}

func ExampleParseRanges() {
	_, err := ipam.ParseRanges([]ipam.RangeSpec{
		{CIDR: "10.0.0.0/24", First: "10.0.0.200", Last: "10.0.0.100"},
		{CIDR: "10.0.0.1/24"},
	})
	fmt.Println(err)
	// Output:
	// ranges[0].first: invalid value "10.0.0.200": is after last (10.0.0.100); swap them; ranges[1].cidr: invalid value "10.0.0.1/24": host bits are set; the network is 10.0.0.0/24
}

func ExampleExhaustedError() {
	ctx := context.Background()
	ranges, _ := ipam.ParseRanges([]ipam.RangeSpec{{CIDR: "192.168.0.0/31"}})
	clock := &stepClock{t: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)}
	m, _ := ipam.NewManager(ipam.Config{
		Pool: "tiny", Holder: "h", Ranges: ranges, Cooldown: 5 * time.Minute,
		Store: ipam.NewMemoryStore(), Clock: clock,
	})
	_, _ = m.Recover(ctx, nil)
	a, _ := m.Allocate(ctx, ipam.Reservation{Token: "a"})
	_, _ = m.Allocate(ctx, ipam.Reservation{Token: "b"})
	_ = m.Release(a, ipam.Owner{Token: "a"})
	_, err := m.Allocate(ctx, ipam.Reservation{Token: "c"})
	var ex *ipam.ExhaustedError
	fmt.Println(errors.As(err, &ex), ex.NextFree.Format(time.TimeOnly))
	fmt.Println(err)
	// Output:
	// true 12:05:00
	// allocate from pool "tiny": pool "tiny" is exhausted: 0 of 2 usable addresses allocated, 1 pending, 1 cooling down; the next address frees at 2026-01-01T12:05:00Z
}
