package pools

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kinds"
)

// memoryPool is a Pool of cidrs over a store in memory, recovered, with no
// client: for the decisions of PlanFamilies and Assign.
func memoryPool(t *testing.T, cidrs ...string) *Pool {
	t.Helper()
	var specs []ipam.RangeSpec
	for _, c := range cidrs {
		specs = append(specs, ipam.RangeSpec{CIDR: c})
	}
	ranges, err := ipam.ParseRanges(specs)
	if err != nil {
		t.Fatal(err)
	}
	p := &Pool{name: "p", ranges: ranges}
	for _, f := range []struct {
		ranges *ipam.Ranges
		dst    **ipam.Manager
	}{{ranges.Family(true), &p.v4}, {ranges.Family(false), &p.v6}} {
		if f.ranges == nil {
			continue
		}
		m, err := ipam.NewManager(ipam.Config{Pool: "p", Holder: "h", Ranges: f.ranges, Store: ipam.NewMemoryStore(), Cooldown: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Recover(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		*f.dst = m
		p.ms = append(p.ms, m)
	}
	return p
}

func static(s string) Static {
	return Static{Addr: netip.MustParseAddr(s), Bits: -1, Raw: s, Path: field.NewPath("spec", "addresses").Index(0)}
}

// TestPlanFamilies: the one plan of a create's families, strict for the
// webhook (what it cannot honour is refused, naming the field) and lenient
// for an object stored without the webhook (never refused).
func TestPlanFamilies(t *testing.T) {
	const (
		v4, v6 = vmipamv1.IPv4, vmipamv1.IPv6
	)
	dual := []string{"10.0.0.0/28", "fd00::/124"}
	tests := map[string]struct {
		cidrs   []string
		ask     Ask
		strict  bool
		want    []vmipamv1.IPFamily
		require bool
		note    string
		wantErr string
	}{
		"unset, one family":                       {cidrs: dual[:1], ask: Ask{}, strict: true, want: []vmipamv1.IPFamily{v4}},
		"unset, the pool's first":                 {cidrs: dual, strict: true, want: []vmipamv1.IPFamily{v4}},
		"an IPv6 static sets the family":          {cidrs: dual, ask: Ask{Statics: []Static{static("fd00::5")}}, strict: true, want: []vmipamv1.IPFamily{v6}},
		"IPv6 first":                              {cidrs: dual, ask: Ask{Families: []string{"IPv6"}}, strict: true, want: []vmipamv1.IPFamily{v6}},
		"prefer, both":                            {cidrs: dual, ask: Ask{Policy: "PreferDualStack"}, strict: true, want: []vmipamv1.IPFamily{v4, v6}},
		"prefer, IPv6 first":                      {cidrs: dual, ask: Ask{Policy: "PreferDualStack", Families: []string{"IPv6"}}, strict: true, want: []vmipamv1.IPFamily{v6, v4}},
		"prefer, one-family pool":                 {cidrs: dual[:1], ask: Ask{Policy: "PreferDualStack"}, strict: true, want: []vmipamv1.IPFamily{v4}, note: "IPPool p has no IPv6 range"},
		"require, both":                           {cidrs: dual, ask: Ask{Policy: "RequireDualStack"}, strict: true, want: []vmipamv1.IPFamily{v4, v6}, require: true},
		"require, one-family pool":                {cidrs: dual[:1], ask: Ask{Policy: "RequireDualStack"}, strict: true, wantErr: "spec.ipFamilyPolicy: Invalid value: \"RequireDualStack\": IPPool p has no IPv6 range"},
		"require, one-family pool, lenient":       {cidrs: dual[:1], ask: Ask{Policy: "RequireDualStack"}, want: []vmipamv1.IPFamily{v4}, require: true},
		"unknown policy":                          {cidrs: dual, ask: Ask{Policy: "Both"}, strict: true, wantErr: "spec.ipFamilyPolicy: Unsupported value: \"Both\""},
		"unknown policy, lenient":                 {cidrs: dual, ask: Ask{Policy: "Both"}, want: []vmipamv1.IPFamily{v4}},
		"unknown family":                          {cidrs: dual, ask: Ask{Families: []string{"IPv5"}}, strict: true, wantErr: "spec.ipFamilies[0]: Unsupported value: \"IPv5\""},
		"unknown family, lenient":                 {cidrs: dual, ask: Ask{Families: []string{"IPv5", "IPv6"}}, want: []vmipamv1.IPFamily{v6}},
		"repeated family":                         {cidrs: dual, ask: Ask{Families: []string{"IPv6", "IPv6"}}, strict: true, wantErr: "spec.ipFamilies[1]: Duplicate value: \"IPv6\""},
		"repeated family, lenient":                {cidrs: dual, ask: Ask{Policy: "PreferDualStack", Families: []string{"IPv6", "IPv6"}}, want: []vmipamv1.IPFamily{v6, v4}},
		"a family the pool lacks":                 {cidrs: dual[:1], ask: Ask{Families: []string{"IPv6"}}, strict: true, wantErr: "spec.ipFamilies[0]: Invalid value: \"IPv6\": IPPool p has no IPv6 range"},
		"a family the pool lacks, lenient":        {cidrs: dual[:1], ask: Ask{Families: []string{"IPv6"}}, want: []vmipamv1.IPFamily{v4}},
		"two statics, single stack":               {cidrs: dual, ask: Ask{Statics: []Static{static("10.0.0.5"), static("fd00::5")}}, strict: true, wantErr: "spec.ipFamilyPolicy: Invalid value: \"SingleStack\": spec.addresses holds an address of each family"},
		"a static of the family not put first":    {cidrs: dual, ask: Ask{Families: []string{"IPv4"}, Statics: []Static{static("fd00::5")}}, strict: true, wantErr: "spec.addresses[0]: Invalid value: \"fd00::5\": an IPv6 address, but spec.ipFamilies puts IPv4 first"},
		"statics of both, prefer, in their order": {cidrs: dual, ask: Ask{Policy: "PreferDualStack", Statics: []Static{static("fd00::5"), static("10.0.0.5")}}, strict: true, want: []vmipamv1.IPFamily{v6, v4}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			plan, ferr := PlanFamilies(kinds.VirtualMachine, tc.ask, memoryPool(t, tc.cidrs...), tc.strict)
			if tc.wantErr != "" {
				if ferr == nil || !strings.Contains(ferr.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", ferr, tc.wantErr)
				}
				return
			}
			if ferr != nil {
				t.Fatalf("unexpected error: %v", ferr)
			}
			if !equalFamilies(plan.Families, tc.want) || plan.Require != tc.require || plan.Note != tc.note {
				t.Errorf("plan %+v, want families %v require %v note %q", plan, tc.want, tc.require, tc.note)
			}
		})
	}
}

func equalFamilies(a, b []vmipamv1.IPFamily) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestAssign: the one assignment loop. A static request is reserved as
// asked; PreferDualStack takes the family it can have and says which it
// could not; RequireDualStack, and a static request that fails, leave
// nothing reserved.
func TestAssign(t *testing.T) {
	ctx := t.Context()
	// A few IPv6 addresses, more IPv4 ones.
	p := memoryPool(t, "10.0.0.0/28", "fd00::/126")
	res := func(tok string) ipam.Reservation {
		return ipam.Reservation{Token: tok, Namespace: "ns", Ref: "ns/" + tok}
	}
	plan := func(ask Ask) Plan {
		pl, ferr := PlanFamilies(kinds.VirtualMachine, ask, p, true)
		if ferr != nil {
			t.Fatal(ferr)
		}
		return pl
	}
	got, err := p.Assign(ctx, res("static"), plan(Ask{Policy: "RequireDualStack", Statics: []Static{static("fd00::2")}}))
	if err != nil || len(got.Addrs) != 2 || got.Addrs[0] != netip.MustParseAddr("fd00::2") || !got.Addrs[1].Is4() || got.Skipped != nil {
		t.Fatalf("a static IPv6 address (first: the static sets the order) with an allocated IPv4 one: %+v, %v", got, err)
	}
	for i := 0; ; i++ {
		_, err := p.Assign(ctx, res(fmt.Sprint("v6-", i)), plan(Ask{Families: []string{"IPv6"}}))
		if errors.Is(err, ipam.ErrExhausted) {
			break
		}
		if err != nil || i == 8 {
			t.Fatalf("IPv6 allocation %d: %v", i, err)
		}
	}
	// IPv6 is out now.
	got, err = p.Assign(ctx, res("prefer"), plan(Ask{Policy: "PreferDualStack"}))
	if err != nil || len(got.Addrs) != 1 || !got.Addrs[0].Is4() || got.Skipped == nil || got.Skipped.Family != vmipamv1.IPv6 || !errors.Is(got.Skipped, ipam.ErrExhausted) {
		t.Fatalf("PreferDualStack with IPv6 out: %+v, %v; want one IPv4 address, IPv6 skipped as exhausted", got, err)
	}
	before := p.Snapshot()
	_, err = p.Assign(ctx, res("require"), plan(Ask{Policy: "RequireDualStack"}))
	var fe *FamilyError
	if !errors.As(err, &fe) || fe.Family != vmipamv1.IPv6 || fe.Static != nil || !errors.Is(err, ipam.ErrExhausted) {
		t.Fatalf("RequireDualStack with IPv6 out: %v; want an IPv6 FamilyError, exhausted", err)
	}
	if after := p.Snapshot(); after.Pending != before.Pending {
		t.Errorf("a refused RequireDualStack left %d pending, want %d: its IPv4 reservation must go back", after.Pending, before.Pending)
	}
	_, err = p.Assign(ctx, res("taken"), plan(Ask{Statics: []Static{static("10.0.0.9")}}))
	if _, err2 := p.Assign(ctx, res("taken-again"), plan(Ask{Statics: []Static{static("10.0.0.9")}})); err != nil || !errors.As(err2, &fe) || fe.Static == nil || fe.Static.Raw != "10.0.0.9" || !errors.Is(err2, ipam.ErrInUse) {
		t.Fatalf("a static address taken twice: %v, then %v; want the second refused as in use, naming the request", err, err2)
	}
}
