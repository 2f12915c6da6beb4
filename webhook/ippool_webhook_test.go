package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	vmipamscheme "github.com/vmipam/vmipam/api/scheme"
	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
)

// ippoolTestPool returns a pool named name with ranges, the others fields
// left at what a Go client sends when it does not set them.
func ippoolTestPool(name string, ranges ...vmipamv1.IPRange) vmipamv1.IPPool {
	return vmipamv1.IPPool{
		TypeMeta:   metav1.TypeMeta{APIVersion: vmipamv1.GroupVersion.String(), Kind: "IPPool"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       vmipamv1.IPPoolSpec{Ranges: ranges},
	}
}

// ippoolCIDR is a range that is only a CIDR.
func ippoolCIDR(cidr string) vmipamv1.IPRange { return vmipamv1.IPRange{CIDR: cidr} }

// ippoolWantErr is one expected field error: its exact path and a part of
// its message.
type ippoolWantErr struct {
	field, msg string
}

func ippoolCheckErrs(t *testing.T, errs field.ErrorList, want []ippoolWantErr) {
	t.Helper()
	if len(errs) != len(want) {
		t.Fatalf("got %d errors, want %d:\n%s", len(errs), len(want), ippoolFormatErrs(errs))
	}
	for i, w := range want {
		if errs[i].Field != w.field {
			t.Errorf("error %d: field %q, want %q (%v)", i, errs[i].Field, w.field, errs[i])
		}
		if !strings.Contains(errs[i].Error(), w.msg) {
			t.Errorf("error %d: %q does not contain %q", i, errs[i].Error(), w.msg)
		}
	}
}

func ippoolFormatErrs(errs field.ErrorList) string {
	var b strings.Builder
	for _, e := range errs {
		b.WriteString("  " + e.Error() + "\n")
	}
	return b.String()
}

func TestValidateIPPoolRanges(t *testing.T) {
	tests := map[string]struct {
		ranges []vmipamv1.IPRange
		want   []ippoolWantErr
	}{
		"single IPv4 CIDR": {
			ranges: []vmipamv1.IPRange{ippoolCIDR("10.0.0.0/24")},
		},
		"dual stack, narrowed, with exclusions": {
			ranges: []vmipamv1.IPRange{
				{CIDR: "10.0.0.0/24", First: "10.0.0.10", Last: "10.0.0.200", Exclude: []string{"10.0.0.64/28", "10.0.0.100"}},
				{CIDR: "fd00::/64", Exclude: []string{"fd00::1"}},
			},
		},
		"no ranges": {
			ranges: nil,
			want:   []ippoolWantErr{{"spec.ranges", "Required value: at least one range is required"}},
		},
		"empty CIDR": {
			ranges: []vmipamv1.IPRange{ippoolCIDR("")},
			want:   []ippoolWantErr{{"spec.ranges[0].cidr", "Required value: a CIDR is required"}},
		},
		"prefix length out of bounds": {
			ranges: []vmipamv1.IPRange{ippoolCIDR("10.0.0.0/33")},
			want:   []ippoolWantErr{{"spec.ranges[0].cidr", `Invalid value: "10.0.0.0/33": not a valid CIDR`}},
		},
		"address without prefix length": {
			ranges: []vmipamv1.IPRange{ippoolCIDR("10.0.0.7")},
			want:   []ippoolWantErr{{"spec.ranges[0].cidr", "for a single address write 10.0.0.7/32"}},
		},
		"IPv6 typo": {
			ranges: []vmipamv1.IPRange{ippoolCIDR("10.1.0.0/24"), ippoolCIDR("fd00:::/64")},
			want:   []ippoolWantErr{{"spec.ranges[1].cidr", `Invalid value: "fd00:::/64": not a valid CIDR`}},
		},
		"host bits set": {
			ranges: []vmipamv1.IPRange{ippoolCIDR("10.0.0.1/24")},
			want:   []ippoolWantErr{{"spec.ranges[0].cidr", "host bits are set; the network is 10.0.0.0/24"}},
		},
		"first after last": {
			ranges: []vmipamv1.IPRange{{CIDR: "10.0.0.0/24", First: "10.0.0.20", Last: "10.0.0.10"}},
			want:   []ippoolWantErr{{"spec.ranges[0].first", `"10.0.0.20": is after last (10.0.0.10); swap them`}},
		},
		"first outside CIDR": {
			ranges: []vmipamv1.IPRange{{CIDR: "10.0.0.0/24", First: "10.0.1.5"}},
			want:   []ippoolWantErr{{"spec.ranges[0].first", "outside the range's CIDR 10.0.0.0/24"}},
		},
		"last is the broadcast address": {
			ranges: []vmipamv1.IPRange{{CIDR: "10.0.0.0/24", Last: "10.0.0.255"}},
			want:   []ippoolWantErr{{"spec.ranges[0].last", "network or broadcast address of 10.0.0.0/24"}},
		},
		"last not an address": {
			ranges: []vmipamv1.IPRange{{CIDR: "10.0.0.0/24", Last: "10.0.0.x"}},
			want:   []ippoolWantErr{{"spec.ranges[0].last", "not a valid IP address"}},
		},
		"exclude outside its range": {
			ranges: []vmipamv1.IPRange{
				ippoolCIDR("10.0.0.0/24"),
				{CIDR: "10.0.1.0/24", Exclude: []string{"10.0.1.7", "10.0.0.5"}},
			},
			want: []ippoolWantErr{{"spec.ranges[1].exclude[1]", "exclusions must lie inside the range they belong to"}},
		},
		"exclude with host bits": {
			ranges: []vmipamv1.IPRange{{CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.1/28"}}},
			want:   []ippoolWantErr{{"spec.ranges[0].exclude[0]", "the network is 10.0.0.0/28"}},
		},
		"ranges of the pool overlap": {
			ranges: []vmipamv1.IPRange{ippoolCIDR("10.0.0.0/16"), ippoolCIDR("10.0.5.0/24")},
			want:   []ippoolWantErr{{"spec.ranges[1].cidr", "overlaps ranges[0] (10.0.0.0/16); ranges of one pool must not overlap"}},
		},
		"everything excluded": {
			ranges: []vmipamv1.IPRange{{CIDR: "10.0.0.0/30", Exclude: []string{"10.0.0.0/30"}}},
			want:   []ippoolWantErr{{"spec.ranges", "Invalid value: the pool has no usable address"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pool := ippoolTestPool("a", tc.ranges...)
			ippoolCheckErrs(t, ValidateIPPool(t.Context(), &pool, nil), tc.want)
		})
	}
}

func TestValidateIPPoolOthers(t *testing.T) {
	defaultPool := func(name, cidr string) vmipamv1.IPPool {
		p := ippoolTestPool(name, ippoolCIDR(cidr))
		p.Spec.Default = true
		return p
	}
	tests := map[string]struct {
		pool   vmipamv1.IPPool
		others []vmipamv1.IPPool
		want   []ippoolWantErr
	}{
		"disjoint subnets": {
			pool:   ippoolTestPool("a", ippoolCIDR("10.0.0.0/25")),
			others: []vmipamv1.IPPool{ippoolTestPool("b", ippoolCIDR("10.0.0.128/25"), ippoolCIDR("fd00::/64"))},
		},
		"same subnet": {
			pool:   ippoolTestPool("a", ippoolCIDR("10.0.0.0/24")),
			others: []vmipamv1.IPPool{ippoolTestPool("b", ippoolCIDR("10.0.0.0/24"))},
			want: []ippoolWantErr{{"spec.ranges[0].cidr",
				`overlaps range 10.0.0.0/24 of IPPool "b" (shared: 10.0.0.1-10.0.0.254); pools must not share addresses`}},
		},
		"subnet inside another pool's": {
			pool:   ippoolTestPool("a", ippoolCIDR("192.168.0.0/24"), ippoolCIDR("10.0.5.0/24")),
			others: []vmipamv1.IPPool{ippoolTestPool("b", ippoolCIDR("10.0.0.0/16"))},
			want:   []ippoolWantErr{{"spec.ranges[1].cidr", `overlaps range 10.0.0.0/16 of IPPool "b" (shared: 10.0.5.1-10.0.5.254)`}},
		},
		"IPv6 subnet inside another pool's": {
			pool:   ippoolTestPool("a", ippoolCIDR("fd00:0:0:1::/64")),
			others: []vmipamv1.IPPool{ippoolTestPool("b", ippoolCIDR("fd00::/48"))},
			want:   []ippoolWantErr{{"spec.ranges[0].cidr", `overlaps range fd00::/48 of IPPool "b"`}},
		},
		"a gateway the other pool hands out": {
			pool:   ippoolTestPool("a", vmipamv1.IPRange{CIDR: "10.0.0.0/24", Last: "10.0.0.127", Gateway: "10.0.0.200"}),
			others: []vmipamv1.IPPool{ippoolTestPool("b", vmipamv1.IPRange{CIDR: "10.0.0.0/24", First: "10.0.0.128"})},
			want:   []ippoolWantErr{{"spec.ranges[0].gateway", `IPPool "b" hands it out: a router must not be given to a VM`}},
		},
		"a pool that would hand out another's next hop": {
			pool: ippoolTestPool("a", vmipamv1.IPRange{CIDR: "10.0.0.0/24", Last: "10.0.0.127"}),
			others: []vmipamv1.IPPool{ippoolTestPool("b", vmipamv1.IPRange{CIDR: "10.0.0.0/24", First: "10.0.0.128", Gateway: "10.0.0.129",
				Routes: []vmipamv1.Route{{Destination: "0.0.0.0/0", Via: "10.0.0.1"}}})},
			want: []ippoolWantErr{{"spec.ranges", `"10.0.0.1": is a gateway or next hop of IPPool "b", and this pool would hand it out`}},
		},
		"one subnet split, one gateway outside both": {
			pool:   ippoolTestPool("a", vmipamv1.IPRange{CIDR: "10.0.0.0/24", First: "10.0.0.2", Last: "10.0.0.127", Gateway: "10.0.0.1"}),
			others: []vmipamv1.IPPool{ippoolTestPool("b", vmipamv1.IPRange{CIDR: "10.0.0.0/24", First: "10.0.0.128", Gateway: "10.0.0.1"})},
		},
		"one subnet split with first and last": {
			pool: ippoolTestPool("a", vmipamv1.IPRange{CIDR: "10.0.0.0/24", Last: "10.0.0.127"}),
			others: []vmipamv1.IPPool{
				ippoolTestPool("b", vmipamv1.IPRange{CIDR: "10.0.0.0/24", First: "10.0.0.128"}),
			},
		},
		"split with one shared address": {
			pool: ippoolTestPool("a", vmipamv1.IPRange{CIDR: "10.0.0.0/24", Last: "10.0.0.128"}),
			others: []vmipamv1.IPPool{
				ippoolTestPool("b", vmipamv1.IPRange{CIDR: "10.0.0.0/24", First: "10.0.0.128"}),
			},
			want: []ippoolWantErr{{"spec.ranges[0].cidr", `overlaps range 10.0.0.0/24 of IPPool "b" (shared: 10.0.0.128)`}},
		},
		"narrowed range of another pool inside this subnet": {
			pool:   ippoolTestPool("a", ippoolCIDR("10.0.0.0/25")),
			others: []vmipamv1.IPPool{ippoolTestPool("b", vmipamv1.IPRange{CIDR: "10.0.0.0/24", First: "10.0.0.100", Last: "10.0.0.200"})},
			want:   []ippoolWantErr{{"spec.ranges[0].cidr", `(shared: 10.0.0.100-10.0.0.126)`}},
		},
		"network and broadcast addresses are never shared": {
			// 10.0.0.0/25 hands out .1-.126, so a host /32 at its
			// broadcast address takes nothing from it.
			pool:   ippoolTestPool("a", ippoolCIDR("10.0.0.0/25")),
			others: []vmipamv1.IPPool{ippoolTestPool("b", ippoolCIDR("10.0.0.127/32"), ippoolCIDR("10.0.0.0/32"))},
		},
		"exclusions make room for another pool": {
			pool:   ippoolTestPool("a", vmipamv1.IPRange{CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.128/25"}}),
			others: []vmipamv1.IPPool{ippoolTestPool("b", ippoolCIDR("10.0.0.128/25"))},
		},
		"one subnet split by excluding each other's part": {
			pool: ippoolTestPool("a", vmipamv1.IPRange{CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.64/26", "10.0.0.200"}}),
			others: []vmipamv1.IPPool{
				ippoolTestPool("b", vmipamv1.IPRange{CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.0/26", "10.0.0.128/25"}}),
				ippoolTestPool("c", vmipamv1.IPRange{CIDR: "10.0.0.200/32"}),
			},
		},
		"exclusions leave shared runs": {
			pool: ippoolTestPool("a", vmipamv1.IPRange{CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.64/26"}}),
			others: []vmipamv1.IPPool{
				ippoolTestPool("b", vmipamv1.IPRange{CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.1", "10.0.0.3/32", "10.0.0.128/25"}}),
			},
			want: []ippoolWantErr{{"spec.ranges[0].cidr",
				`overlaps range 10.0.0.0/24 of IPPool "b" (shared: 10.0.0.2, 10.0.0.4-10.0.0.63); pools must not share addresses: narrow one of them with first/last, exclude the shared addresses from one, or use another subnet`}},
		},
		"many shared runs, the first four listed": {
			pool: ippoolTestPool("a", ippoolCIDR("10.0.0.0/24")),
			others: []vmipamv1.IPPool{
				ippoolTestPool("b", vmipamv1.IPRange{CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.2", "10.0.0.4", "10.0.0.6", "10.0.0.8", "10.0.0.10/31", "10.0.0.12/30", "10.0.0.16/28", "10.0.0.32/27", "10.0.0.64/26", "10.0.0.128/25"}}),
			},
			want: []ippoolWantErr{{"spec.ranges[0].cidr", `(shared: 10.0.0.1, 10.0.0.3, 10.0.0.5, 10.0.0.7 and 1 more)`}},
		},
		"many overlapping pairs, the first eight listed": {
			pool: ippoolTestPool("a", ippoolCIDR("10.0.0.0/24"), ippoolCIDR("10.0.1.0/24")),
			others: []vmipamv1.IPPool{
				ippoolTestPool("b", ippoolCIDR("10.0.1.0/28"), ippoolCIDR("10.0.1.16/28"), ippoolCIDR("10.0.1.32/28"), ippoolCIDR("10.0.1.48/28")),
				ippoolTestPool("c", ippoolCIDR("10.0.0.0/28"), ippoolCIDR("10.0.0.16/28"), ippoolCIDR("10.0.0.32/28"), ippoolCIDR("10.0.0.48/28"),
					ippoolCIDR("10.0.0.64/28"), ippoolCIDR("10.0.0.80/28"), ippoolCIDR("10.0.0.96/28")),
			},
			want: []ippoolWantErr{
				{"spec.ranges[0].cidr", `range 10.0.0.0/28 of IPPool "c"`},
				{"spec.ranges[0].cidr", `range 10.0.0.16/28 of IPPool "c"`},
				{"spec.ranges[0].cidr", `range 10.0.0.32/28 of IPPool "c"`},
				{"spec.ranges[0].cidr", `range 10.0.0.48/28 of IPPool "c"`},
				{"spec.ranges[1].cidr", `range 10.0.1.0/28 of IPPool "b"`},
				{"spec.ranges[1].cidr", `range 10.0.1.16/28 of IPPool "b"`},
				{"spec.ranges[1].cidr", `range 10.0.1.32/28 of IPPool "b"`},
				{"spec.ranges[1].cidr", `range 10.0.1.48/28 of IPPool "b"`},
				{"spec.ranges", "and 3 more pairs of a range of this pool and a range of another IPPool share addresses, not listed"},
			},
		},
		"ipv4 and ipv6 equal as numbers do not overlap": {
			pool:   ippoolTestPool("a", ippoolCIDR("10.0.0.0/24")),
			others: []vmipamv1.IPPool{ippoolTestPool("b", ippoolCIDR("::a00:0/120"))},
		},
		"overlaps two pools, reported by name": {
			pool: ippoolTestPool("a", ippoolCIDR("10.0.0.0/16")),
			others: []vmipamv1.IPPool{
				ippoolTestPool("c", ippoolCIDR("10.0.2.0/24")),
				ippoolTestPool("b", ippoolCIDR("10.0.1.0/24")),
			},
			want: []ippoolWantErr{
				{"spec.ranges[0].cidr", `IPPool "b"`},
				{"spec.ranges[0].cidr", `IPPool "c"`},
			},
		},
		"update ignores the pool itself": {
			pool:   ippoolTestPool("a", ippoolCIDR("10.0.0.0/24")),
			others: []vmipamv1.IPPool{ippoolTestPool("a", ippoolCIDR("10.0.0.0/23"))},
		},
		"other pool with a broken range is skipped": {
			pool:   ippoolTestPool("a", ippoolCIDR("10.0.0.0/24")),
			others: []vmipamv1.IPPool{ippoolTestPool("b", ippoolCIDR("10.0.0.0/33"))},
		},
		"other pool that does not parse is skipped whole": {
			// Its allocator cannot build it either, so it hands nothing
			// out; its next update is checked against this pool.
			pool:   ippoolTestPool("a", ippoolCIDR("10.0.0.0/24")),
			others: []vmipamv1.IPPool{ippoolTestPool("b", ippoolCIDR("10.0.0.0/25"), ippoolCIDR("10.0.1.0/33"))},
		},
		"other pool with an IPv4-mapped spelling is skipped": {
			pool:   ippoolTestPool("a", ippoolCIDR("10.0.0.0/24")),
			others: []vmipamv1.IPPool{ippoolTestPool("b", ippoolCIDR("::ffff:10.0.0.0/120"))},
		},
		"first default": {
			pool:   defaultPool("a", "10.0.0.0/24"),
			others: []vmipamv1.IPPool{ippoolTestPool("b", ippoolCIDR("10.1.0.0/24"))},
		},
		"second default": {
			pool:   defaultPool("a", "10.0.0.0/24"),
			others: []vmipamv1.IPPool{defaultPool("b", "10.1.0.0/24")},
			want:   []ippoolWantErr{{"spec.default", `Invalid value: true: IPPool "b" is already the default`}},
		},
		"non-default beside a default": {
			pool:   ippoolTestPool("a", ippoolCIDR("10.0.0.0/24")),
			others: []vmipamv1.IPPool{defaultPool("b", "10.1.0.0/24")},
		},
		"default update of the default pool": {
			pool:   defaultPool("a", "10.0.0.0/24"),
			others: []vmipamv1.IPPool{defaultPool("a", "10.0.0.0/24")},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ippoolCheckErrs(t, ValidateIPPool(t.Context(), &tc.pool, tc.others), tc.want)
		})
	}
}

func TestValidateIPPoolSettings(t *testing.T) {
	tests := map[string]struct {
		spec func(*vmipamv1.IPPoolSpec)
		want []ippoolWantErr
	}{
		"defaults left unset": {
			spec: func(*vmipamv1.IPPoolSpec) {},
		},
		"everything set and sane": {
			spec: func(s *vmipamv1.IPPoolSpec) {
				s.Cooldown = &metav1.Duration{Duration: 10 * time.Minute}
				s.PendingTTL = &metav1.Duration{Duration: 90 * time.Second}
				s.MaxPendingPerNamespace = ptr.To[int32](1)
				s.AllowedNamespaces = &vmipamv1.NamespaceRestriction{
					Names:    []string{"team-a", "b"},
					Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"vmipam.io/pool": "a"}},
				}
				s.Watermarks = &vmipamv1.Watermarks{Low: 0, Target: 4096, High: 4096}
				s.NamespaceSelector = &metav1.LabelSelector{
					MatchLabels:      map[string]string{"team": "a"},
					MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "env", Operator: metav1.LabelSelectorOpIn, Values: []string{"prod"}}},
				}
			},
		},
		"zero cooldown means none": {
			spec: func(s *vmipamv1.IPPoolSpec) { s.Cooldown = &metav1.Duration{} },
		},
		"negative cooldown": {
			spec: func(s *vmipamv1.IPPoolSpec) { s.Cooldown = &metav1.Duration{Duration: -time.Second} },
			want: []ippoolWantErr{{"spec.cooldown", `Invalid value: "-1s": must not be negative: it is how long a released address rests before reuse; 0s means no cooldown, and leaving the field out takes the default, 5m0s`}},
		},
		"pendingTTL of the API server's request timeout": {
			spec: func(s *vmipamv1.IPPoolSpec) { s.PendingTTL = &metav1.Duration{Duration: time.Minute} },
		},
		"short pendingTTL": {
			spec: func(s *vmipamv1.IPPoolSpec) { s.PendingTTL = &metav1.Duration{Duration: 59 * time.Second} },
			want: []ippoolWantErr{{"spec.pendingTTL", `Invalid value: "59s": must be at least 60s, the API server's default request timeout; ` +
				"an address reserved at admission waits this long for its VirtualMachine to be stored, and the create may still be in flight (the default is 2m0s)"}},
		},
		"zero pendingTTL": {
			spec: func(s *vmipamv1.IPPoolSpec) { s.PendingTTL = &metav1.Duration{} },
			want: []ippoolWantErr{{"spec.pendingTTL", `Invalid value: "0s": must be at least 60s`}},
		},
		"negative pendingTTL": {
			spec: func(s *vmipamv1.IPPoolSpec) { s.PendingTTL = &metav1.Duration{Duration: -time.Minute} },
			want: []ippoolWantErr{{"spec.pendingTTL", "must be at least 60s"}},
		},
		"zero maxPendingPerNamespace": {
			spec: func(s *vmipamv1.IPPoolSpec) { s.MaxPendingPerNamespace = ptr.To[int32](0) },
			want: []ippoolWantErr{{"spec.maxPendingPerNamespace", "Invalid value: 0: must be at least 1"}},
		},
		"negative maxPendingPerNamespace": {
			spec: func(s *vmipamv1.IPPoolSpec) { s.MaxPendingPerNamespace = ptr.To[int32](-5) },
			want: []ippoolWantErr{{"spec.maxPendingPerNamespace", "Invalid value: -5: must be at least 1: it bounds the reservations of one namespace"}},
		},
		"allowedNamespaces by name only": {
			spec: func(s *vmipamv1.IPPoolSpec) {
				s.AllowedNamespaces = &vmipamv1.NamespaceRestriction{Names: []string{"default"}}
			},
		},
		"allowedNamespaces by selector only": {
			spec: func(s *vmipamv1.IPPoolSpec) {
				s.AllowedNamespaces = &vmipamv1.NamespaceRestriction{Selector: &metav1.LabelSelector{
					MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: metav1.LabelSelectorOpExists}},
				}}
			},
		},
		"allowedNamespaces empty": {
			spec: func(s *vmipamv1.IPPoolSpec) { s.AllowedNamespaces = &vmipamv1.NamespaceRestriction{Names: []string{}} },
			want: []ippoolWantErr{{"spec.allowedNamespaces", "Required value: name namespaces in names or give a selector; to allow every namespace, leave allowedNamespaces out"}},
		},
		"allowedNamespaces names not namespaces": {
			spec: func(s *vmipamv1.IPPoolSpec) {
				s.AllowedNamespaces = &vmipamv1.NamespaceRestriction{Names: []string{"ok", "Team_A", "", "ok", strings.Repeat("x", 64)}}
			},
			want: []ippoolWantErr{
				{"spec.allowedNamespaces.names[1]", `Invalid value: "Team_A": not a namespace name: a lowercase RFC 1123 label`},
				{"spec.allowedNamespaces.names[2]", `Invalid value: "": not a namespace name`},
				{"spec.allowedNamespaces.names[3]", `Duplicate value: "ok"`},
				{"spec.allowedNamespaces.names[4]", "must be no more than 63 characters"},
			},
		},
		"allowedNamespaces invalid selector": {
			spec: func(s *vmipamv1.IPPoolSpec) {
				s.AllowedNamespaces = &vmipamv1.NamespaceRestriction{Names: []string{"a"}, Selector: &metav1.LabelSelector{
					MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: metav1.LabelSelectorOpIn}},
				}}
			},
			want: []ippoolWantErr{{"spec.allowedNamespaces.selector", "not a valid label selector"}},
		},
		"negative low watermark": {
			spec: func(s *vmipamv1.IPPoolSpec) { s.Watermarks = &vmipamv1.Watermarks{Low: -1, Target: 8, High: 16} },
			want: []ippoolWantErr{{"spec.watermarks.low", "Invalid value: -1: must not be negative"}},
		},
		"low above target": {
			spec: func(s *vmipamv1.IPPoolSpec) { s.Watermarks = &vmipamv1.Watermarks{Low: 64, Target: 32, High: 128} },
			want: []ippoolWantErr{{"spec.watermarks.low", "Invalid value: 64: must not exceed target (32)"}},
		},
		"high below target": {
			spec: func(s *vmipamv1.IPPoolSpec) { s.Watermarks = &vmipamv1.Watermarks{Low: 8, Target: 32, High: 16} },
			want: []ippoolWantErr{{"spec.watermarks.high", "Invalid value: 16: must be at least target (32)"}},
		},
		"zero target": {
			spec: func(s *vmipamv1.IPPoolSpec) { s.Watermarks = &vmipamv1.Watermarks{} },
			want: []ippoolWantErr{{"spec.watermarks.target", "Invalid value: 0: must be between 1 and 4096"}},
		},
		"target larger than a block": {
			spec: func(s *vmipamv1.IPPoolSpec) { s.Watermarks = &vmipamv1.Watermarks{Low: 1, Target: 4097, High: 5000} },
			want: []ippoolWantErr{{"spec.watermarks.target", "Invalid value: 4097: must be between 1 and 4096 (the size of an address block)"}},
		},
		"unknown selector operator": {
			spec: func(s *vmipamv1.IPPoolSpec) {
				s.NamespaceSelector = &metav1.LabelSelector{
					MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "env", Operator: "Equals", Values: []string{"prod"}}},
				}
			},
			want: []ippoolWantErr{{"spec.namespaceSelector", `"Equals" is not a valid label selector operator`}},
		},
		"invalid selector label value": {
			spec: func(s *vmipamv1.IPPoolSpec) {
				s.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "not valid!"}}
			},
			want: []ippoolWantErr{{"spec.namespaceSelector", "not a valid label selector"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pool := ippoolTestPool("a", ippoolCIDR("10.0.0.0/24"))
			tc.spec(&pool.Spec)
			ippoolCheckErrs(t, ValidateIPPool(t.Context(), &pool, nil), tc.want)
		})
	}
}

func TestValidateIPPoolReportsEveryError(t *testing.T) {
	pool := ippoolTestPool("a",
		vmipamv1.IPRange{CIDR: "10.0.0.0/24", First: "10.0.0.200", Last: "10.0.0.100"},
		ippoolCIDR("fd00::1/64"),
		vmipamv1.IPRange{CIDR: "10.2.0.0/24", Exclude: []string{"10.3.0.0/24"}},
		ippoolCIDR("10.1.0.0/24"),
	)
	pool.Spec.Default = true
	pool.Spec.PendingTTL = &metav1.Duration{Duration: time.Second}
	pool.Spec.Cooldown = &metav1.Duration{Duration: -time.Minute}
	pool.Spec.MaxPendingPerNamespace = ptr.To[int32](0)
	pool.Spec.AllowedNamespaces = &vmipamv1.NamespaceRestriction{Names: []string{"NO"}}
	pool.Spec.Watermarks = &vmipamv1.Watermarks{Low: 10, Target: 5, High: 1}
	pool.Spec.NamespaceSelector = &metav1.LabelSelector{
		MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "env", Operator: metav1.LabelSelectorOpExists, Values: []string{"x"}}},
	}
	others := []vmipamv1.IPPool{ippoolTestPool("b", ippoolCIDR("10.1.0.0/25"))}
	others[0].Spec.Default = true

	ippoolCheckErrs(t, ValidateIPPool(t.Context(), &pool, others), []ippoolWantErr{
		{"spec.ranges[0].first", "is after last"},
		{"spec.ranges[1].cidr", "host bits are set"},
		{"spec.ranges[2].exclude[0]", "outside the range's CIDR 10.2.0.0/24"},
		{"spec.ranges[3].cidr", `overlaps range 10.1.0.0/25 of IPPool "b"`},
		{"spec.default", `IPPool "b" is already the default`},
		{"spec.cooldown", "must not be negative"},
		{"spec.pendingTTL", "must be at least 60s"},
		{"spec.maxPendingPerNamespace", "must be at least 1"},
		{"spec.allowedNamespaces.names[0]", "not a namespace name"},
		{"spec.watermarks.low", "must not exceed target (5)"},
		{"spec.watermarks.high", "must be at least target (5)"},
		{"spec.namespaceSelector", "not a valid label selector"},
	})
}

func TestIPPoolFieldPath(t *testing.T) {
	tests := map[string]struct {
		in   ipam.Path
		want string
	}{
		"top level":     {in: ipam.Path{}.Child("ranges"), want: "spec.ranges"},
		"indexed child": {in: ipam.Path{}.Child("ranges").Index(0).Child("first"), want: "spec.ranges[0].first"},
		"nested index":  {in: ipam.Path{}.Child("ranges").Index(1).Child("exclude").Index(12), want: "spec.ranges[1].exclude[12]"},
		"empty":         {in: nil, want: "spec"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := ippoolFieldPath(field.NewPath("spec"), tc.in).String(); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestIPPoolUpdateWarnings(t *testing.T) {
	tests := map[string]struct {
		old, new []vmipamv1.IPRange
		want     []string // substrings, one per warning
	}{
		"unchanged": {
			old: []vmipamv1.IPRange{ippoolCIDR("10.0.0.0/24")},
			new: []vmipamv1.IPRange{ippoolCIDR("10.0.0.0/24")},
		},
		"range added": {
			old: []vmipamv1.IPRange{ippoolCIDR("10.0.0.0/24")},
			new: []vmipamv1.IPRange{ippoolCIDR("10.0.0.0/24"), ippoolCIDR("10.0.1.0/24")},
		},
		"range widened": {
			old: []vmipamv1.IPRange{{CIDR: "10.0.0.0/24", Last: "10.0.0.100"}},
			new: []vmipamv1.IPRange{ippoolCIDR("10.0.0.0/23")},
		},
		"exclusion dropped": {
			old: []vmipamv1.IPRange{{CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.5"}}},
			new: []vmipamv1.IPRange{ippoolCIDR("10.0.0.0/24")},
		},
		"range removed": {
			old: []vmipamv1.IPRange{ippoolCIDR("10.0.0.0/24"), ippoolCIDR("fd00::/120")},
			new: []vmipamv1.IPRange{ippoolCIDR("10.0.0.0/24")},
			want: []string{
				"spec.ranges: the update takes fd00::1-fd00::ff out of the pool; VirtualMachines that hold these addresses keep them, but vmipam no longer hands them out",
			},
		},
		"range narrowed with last": {
			old:  []vmipamv1.IPRange{ippoolCIDR("10.0.0.0/24")},
			new:  []vmipamv1.IPRange{{CIDR: "10.0.0.0/24", Last: "10.0.0.127"}},
			want: []string{"takes 10.0.0.128-10.0.0.254 out of the pool"},
		},
		"range narrowed on both ends": {
			old:  []vmipamv1.IPRange{ippoolCIDR("10.0.0.0/24")},
			new:  []vmipamv1.IPRange{{CIDR: "10.0.0.0/24", First: "10.0.0.10", Last: "10.0.0.250"}},
			want: []string{"takes 10.0.0.1-10.0.0.9 out", "takes 10.0.0.251-10.0.0.254 out"},
		},
		"subnet shrunk": {
			old:  []vmipamv1.IPRange{ippoolCIDR("10.0.0.0/23")},
			new:  []vmipamv1.IPRange{ippoolCIDR("10.0.0.0/24")},
			want: []string{"takes 10.0.0.255-10.0.1.254 out"},
		},
		"exclusion added": {
			old:  []vmipamv1.IPRange{ippoolCIDR("10.0.0.0/24")},
			new:  []vmipamv1.IPRange{{CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.7"}}},
			want: []string{"takes 10.0.0.7 out of the pool"},
		},
		"many spans removed": {
			old: []vmipamv1.IPRange{
				ippoolCIDR("10.0.1.0/24"), ippoolCIDR("10.0.2.0/24"), ippoolCIDR("10.0.3.0/24"), ippoolCIDR("10.0.4.0/24"),
				ippoolCIDR("10.0.5.0/24"), ippoolCIDR("10.0.6.0/24"), ippoolCIDR("10.0.7.0/24"), ippoolCIDR("10.0.8.0/24"),
			},
			new: []vmipamv1.IPRange{ippoolCIDR("10.0.0.0/24")},
			want: []string{
				"takes 10.0.1.1-10.0.1.254 out", "10.0.2.1", "10.0.3.1", "10.0.4.1", "10.0.5.1",
				"the update takes 3 more address spans out of the pool",
			},
		},
		"old spec that does not parse": {
			old: []vmipamv1.IPRange{ippoolCIDR("10.0.0.0/24"), ippoolCIDR("10.0.0.0/25")},
			new: []vmipamv1.IPRange{ippoolCIDR("10.0.1.0/24")},
		},
		"top of the IPv6 space": {
			old:  []vmipamv1.IPRange{ippoolCIDR("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00/120")},
			new:  []vmipamv1.IPRange{{CIDR: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00/120", Exclude: []string{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff0/124"}}},
			want: []string{"takes ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff0-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff out"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			old, pool := ippoolTestPool("a", tc.old...), ippoolTestPool("a", tc.new...)
			errs, ranges := ippoolValidate(t.Context(), &pool, nil, (&IPPoolValidator{}).parsed.get)
			if len(errs) > 0 {
				t.Fatalf("new pool invalid: %v", errs)
			}
			got := ippoolUpdateWarnings(t.Context(), &old, ranges)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d warnings, want %d: %q", len(got), len(tc.want), got)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("warning %d: %q does not contain %q", i, got[i], w)
				}
				if len(got[i]) > 256 {
					t.Errorf("warning %d is %d characters; the API server may truncate it", i, len(got[i]))
				}
			}
		})
	}
}

func ippoolTestScheme(t testing.TB) *runtime.Scheme {
	t.Helper()
	return vmipamscheme.Scheme
}

func ippoolRaw(t *testing.T, pool *vmipamv1.IPPool) runtime.RawExtension {
	t.Helper()
	if pool == nil {
		return runtime.RawExtension{}
	}
	b, err := json.Marshal(pool)
	if err != nil {
		t.Fatalf("marshal IPPool: %v", err)
	}
	return runtime.RawExtension{Raw: b}
}

func TestIPPoolValidatorHandle(t *testing.T) {
	existing := ippoolTestPool("b", ippoolCIDR("10.1.0.0/24"))
	overlapping := ippoolTestPool("c", ippoolCIDR("10.1.0.0/25"))
	valid := ippoolTestPool("a", ippoolCIDR("10.0.0.0/24"))
	narrowed := ippoolTestPool("a", vmipamv1.IPRange{CIDR: "10.0.0.0/24", Last: "10.0.0.99"})
	invalid := ippoolTestPool("x", vmipamv1.IPRange{CIDR: "10.0.0.0/24", First: "10.0.1.1"})
	retuned := *overlapping.DeepCopy()
	retuned.Spec.Cooldown = &metav1.Duration{Duration: time.Minute}
	relabelled := *overlapping.DeepCopy()
	relabelled.Labels = map[string]string{"team": "a"}
	vmKind := metav1.GroupVersionKind{Group: "vmipam.io", Version: "v1alpha1", Kind: "VirtualMachine"}
	vmResource := metav1.GroupVersionResource{Group: "vmipam.io", Version: "v1alpha1", Resource: "virtualmachines"}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	const serves = "vmipam's IPPool validating webhook serves ippools.vmipam.io/v1alpha1 (kind vmipam.io/v1alpha1 IPPool), not "

	tests := map[string]struct {
		op          admissionv1.Operation
		obj, old    *vmipamv1.IPPool
		raw         []byte // overrides obj
		kind        *metav1.GroupVersionKind
		resource    *metav1.GroupVersionResource
		subResource string
		ctx         context.Context
		listErr     error
		allowed     bool
		code        int32
		msg         []string
		causeField  string
		warnings    []string
	}{
		"create valid": {
			op: admissionv1.Create, obj: &valid, allowed: true, code: http.StatusOK,
		},
		"create invalid": {
			op: admissionv1.Create, obj: &invalid, code: http.StatusUnprocessableEntity,
			msg: []string{
				`IPPool.vmipam.io "x" is invalid: spec.ranges[0].first: Invalid value: "10.0.1.1": outside the range's CIDR 10.0.0.0/24`,
			},
			causeField: "spec.ranges[0].first",
		},
		"create overlapping a stored pool": {
			op: admissionv1.Create, obj: &overlapping, code: http.StatusUnprocessableEntity,
			msg:        []string{`IPPool.vmipam.io "c" is invalid: spec.ranges[0].cidr`, `overlaps range 10.1.0.0/24 of IPPool "b"`},
			causeField: "spec.ranges[0].cidr",
		},
		"update narrowing warns": {
			op: admissionv1.Update, obj: &narrowed, old: &valid, allowed: true, code: http.StatusOK,
			warnings: []string{"takes 10.0.0.100-10.0.0.254 out of the pool"},
		},
		"update widening is silent": {
			op: admissionv1.Update, obj: &valid, old: &narrowed, allowed: true, code: http.StatusOK,
		},
		"metadata update of an invalid stored pool": {
			op: admissionv1.Update, obj: &relabelled, old: &overlapping, allowed: true, code: http.StatusOK,
		},
		"spec update of an invalid stored pool": {
			op: admissionv1.Update, obj: &retuned, old: &overlapping, code: http.StatusUnprocessableEntity,
			msg:        []string{`IPPool "b"`},
			causeField: "spec.ranges[0].cidr",
		},
		"delete": {
			op: admissionv1.Delete, old: &existing, allowed: true, code: http.StatusOK,
		},
		"undecodable object": {
			op: admissionv1.Create, raw: []byte(`{"apiVersion":"vmipam.io/v1alpha1","kind":"IPPool","spec":{"ranges":"nope"}}`),
			code: http.StatusBadRequest, msg: []string{"decode IPPool"},
		},
		"list fails": {
			op: admissionv1.Create, obj: &valid, listErr: errors.New("cache not synced"),
			code: http.StatusInternalServerError, msg: []string{"list IPPools: cache not synced"},
		},
		"another kind": {
			op: admissionv1.Create, obj: &valid, kind: &vmKind, resource: &vmResource, code: http.StatusBadRequest,
			msg: []string{serves + "virtualmachines.vmipam.io/v1alpha1 (kind vmipam.io/v1alpha1 VirtualMachine): check the webhook configuration's rules"},
		},
		"another kind, on delete too": {
			op: admissionv1.Delete, old: &valid, kind: &vmKind, resource: &vmResource, code: http.StatusBadRequest,
			msg: []string{serves + "virtualmachines.vmipam.io/v1alpha1"},
		},
		"another version of the kind": {
			op: admissionv1.Create, obj: &valid, kind: &metav1.GroupVersionKind{Group: "vmipam.io", Version: "v1beta1", Kind: "IPPool"}, code: http.StatusBadRequest,
			msg: []string{serves + "ippools.vmipam.io/v1alpha1 (kind vmipam.io/v1beta1 IPPool)"},
		},
		"another resource": {
			op: admissionv1.Create, obj: &valid, resource: &metav1.GroupVersionResource{Group: "vmipam.io", Version: "v1alpha1", Resource: "ipblocks"},
			code: http.StatusBadRequest, msg: []string{serves + "ipblocks.vmipam.io/v1alpha1 (kind vmipam.io/v1alpha1 IPPool)"},
		},
		"a subresource": {
			op: admissionv1.Update, obj: &narrowed, old: &valid, subResource: "status", code: http.StatusBadRequest,
			msg: []string{serves + "ippools.vmipam.io/v1alpha1/status (kind vmipam.io/v1alpha1 IPPool)"},
		},
		"request already ended": {
			op: admissionv1.Create, obj: &valid, ctx: cancelled, code: http.StatusGatewayTimeout,
			msg: []string{`validate IPPool "a": the admission request ended before validation finished (context canceled); nothing was admitted`},
		},
		"request ended while listing": {
			op: admissionv1.Create, obj: &valid, ctx: cancelled, listErr: context.Canceled, code: http.StatusGatewayTimeout,
			msg: []string{"the admission request ended before validation finished"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			builder := fake.NewClientBuilder().WithScheme(ippoolTestScheme(t)).WithObjects(existing.DeepCopy())
			if tc.listErr != nil {
				builder = builder.WithInterceptorFuncs(interceptor.Funcs{
					List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error {
						return tc.listErr
					},
				})
			}
			v := NewIPPoolValidator(builder.Build(), ippoolTestScheme(t))
			req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
				Operation: tc.op, Object: ippoolRaw(t, tc.obj), OldObject: ippoolRaw(t, tc.old),
				Kind: ippoolGVK, Resource: ippoolGVR, SubResource: tc.subResource,
			}}
			if tc.kind != nil {
				req.Kind = *tc.kind
			}
			if tc.resource != nil {
				req.Resource = *tc.resource
			}
			if tc.raw != nil {
				req.Object = runtime.RawExtension{Raw: tc.raw}
			}
			if tc.obj != nil {
				req.Name = tc.obj.Name
			}
			ctx := t.Context()
			if tc.ctx != nil {
				ctx = tc.ctx
			}

			resp := v.Handle(ctx, req)

			if resp.Allowed != tc.allowed {
				t.Fatalf("allowed = %v, want %v (%+v)", resp.Allowed, tc.allowed, resp.Result)
			}
			if resp.Result == nil || resp.Result.Code != tc.code {
				t.Fatalf("result %+v, want code %d", resp.Result, tc.code)
			}
			for _, m := range tc.msg {
				if !strings.Contains(resp.Result.Message, m) {
					t.Errorf("message %q does not contain %q", resp.Result.Message, m)
				}
			}
			if tc.causeField != "" {
				if resp.Result.Reason != metav1.StatusReasonInvalid {
					t.Errorf("reason %q, want %q", resp.Result.Reason, metav1.StatusReasonInvalid)
				}
				if d := resp.Result.Details; d == nil || d.Kind != "IPPool" || d.Group != "vmipam.io" || len(d.Causes) == 0 || d.Causes[0].Field != tc.causeField {
					t.Errorf("details %+v, want the first cause at %s", d, tc.causeField)
				}
			}
			if len(resp.Warnings) != len(tc.warnings) {
				t.Fatalf("warnings %q, want %d", resp.Warnings, len(tc.warnings))
			}
			for i, w := range tc.warnings {
				if !strings.Contains(resp.Warnings[i], w) {
					t.Errorf("warning %q does not contain %q", resp.Warnings[i], w)
				}
			}
		})
	}
}

// ippoolCountingCtx is a context whose Err reports nil for its first ok
// calls and context.Canceled after, counting them: a request that ends in
// the middle of a validation.
type ippoolCountingCtx struct {
	context.Context
	ok, calls int
}

func (c *ippoolCountingCtx) Err() error {
	if c.calls++; c.calls > c.ok {
		return context.Canceled
	}
	return nil
}

// TestValidateIPPoolDeadline checks that validation looks at the request's
// context as it goes, and stops once it is done.
func TestValidateIPPoolDeadline(t *testing.T) {
	// 40 other pools at the CRD's limits, copies of one (they overlap
	// each other, which is not this pool's business): a look at the
	// context each.
	pool := ippoolAtLimits("big", 0, 0)
	other := ippoolAtLimits("", 1, 0)
	others := make([]vmipamv1.IPPool, 40)
	for i := range others {
		others[i] = other
		others[i].Name = fmt.Sprintf("other-%02d", i)
	}
	t.Run("looks at the context in its loops", func(t *testing.T) {
		ctx := &ippoolCountingCtx{Context: t.Context(), ok: 1 << 30}
		if errs := ValidateIPPool(ctx, &pool, others); len(errs) != 0 {
			t.Fatalf("errors: %v", errs)
		}
		if ctx.calls < 40 {
			t.Errorf("validation against 40 pools at the limits looked at the context %d times", ctx.calls)
		}
	})
	t.Run("stops when the request ends", func(t *testing.T) {
		ctx := &ippoolCountingCtx{Context: t.Context(), ok: 3}
		errs := ValidateIPPool(ctx, &pool, others)
		ippoolCheckErrs(t, errs, []ippoolWantErr{{"spec",
			"Internal error: validation stopped before it finished, because the admission request ended (context canceled); the pool was not checked: retry"}})
		if ctx.calls > 6 {
			t.Errorf("validation went on after the request ended: %d looks at the context", ctx.calls)
		}
	})
	t.Run("ended before it starts", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		ippoolCheckErrs(t, ValidateIPPool(ctx, &pool, others), []ippoolWantErr{{"spec", "validation stopped before it finished"}})
	})
}

// TestValidateIPPoolBounded checks that what a denial says stays small,
// however many mistakes or shared addresses there are.
func TestValidateIPPoolBounded(t *testing.T) {
	t.Run("range errors", func(t *testing.T) {
		r := vmipamv1.IPRange{CIDR: "10.0.0.0/24"}
		for i := range 300 {
			r.Exclude = append(r.Exclude, fmt.Sprintf("10.0.1.%d", i%256))
		}
		pool := ippoolTestPool("a", r)
		errs := ValidateIPPool(t.Context(), &pool, nil)
		if len(errs) != ippoolMaxRangeErrors+1 {
			t.Fatalf("%d errors, want %d", len(errs), ippoolMaxRangeErrors+1)
		}
		if errs[0].Field != "spec.ranges[0].exclude[0]" || errs[63].Field != "spec.ranges[0].exclude[63]" {
			t.Errorf("first errors at %s ... %s", errs[0].Field, errs[63].Field)
		}
		if last := errs[len(errs)-1]; last.Field != "spec.ranges" || !strings.Contains(last.Error(), "and 236 more problems in the ranges, not listed") {
			t.Errorf("last error %v", last)
		}
	})
	t.Run("overlaps with many pools at the limits", func(t *testing.T) {
		pool := ippoolAtLimits("big", 0, 0)
		other := ippoolAtLimits("", 0, 1)
		others := make([]vmipamv1.IPPool, 20)
		for i := range others {
			others[i] = other
			others[i].Name = fmt.Sprintf("other-%02d", i)
		}
		errs := ValidateIPPool(t.Context(), &pool, others)
		if len(errs) != ippoolMaxOverlapErrors+1 {
			t.Fatalf("%d errors, want %d:\n%s", len(errs), ippoolMaxOverlapErrors+1, ippoolFormatErrs(errs))
		}
		if n := len(ippoolFormatErrs(errs)); n > 8<<10 {
			t.Errorf("the errors take %d bytes:\n%s", n, ippoolFormatErrs(errs))
		}
		// Every range of the pool shares runs with the same range of each
		// other pool: 64 × 20 pairs, 8 listed.
		if last := errs[len(errs)-1].Error(); !strings.Contains(last, fmt.Sprintf("and %d more pairs", 64*20-ippoolMaxOverlapErrors)) {
			t.Errorf("last error %s", last)
		}
		if first := errs[0].Error(); !strings.Contains(first, `spec.ranges[0].cidr: Invalid value: "10.0.0.0/21": overlaps range 10.0.0.0/21 of IPPool "other-00" (shared: 10.0.0.8-10.0.0.9, 10.0.0.12-10.0.0.17, 10.0.0.20-10.0.0.25, 10.0.0.28-10.0.0.33 and 252 more)`) {
			t.Errorf("first error %s", first)
		}
	})
}

// TestParsedRangesFollowGeneration: the validator's parsed ranges of other
// pools are reused only for the generation they were parsed at, and
// forgotten with their pool.
func TestParsedRangesFollowGeneration(t *testing.T) {
	var c parsedRanges
	pool := ippoolTestPool("a", ippoolCIDR("10.0.0.0/24"))
	pool.UID, pool.Generation = "uid-a", 1
	r1, err := c.get(&pool)
	if err != nil || !r1.Contains(mustAddr("10.0.0.9")) {
		t.Fatalf("first parse: %v, %v", r1, err)
	}
	pool.Spec.Ranges = []vmipamv1.IPRange{ippoolCIDR("10.9.0.0/24")}
	if r, _ := c.get(&pool); r != r1 {
		t.Fatal("the same generation was parsed again")
	}
	pool.Generation = 2
	if r, _ := c.get(&pool); r == r1 || !r.Contains(mustAddr("10.9.0.9")) || r.Contains(mustAddr("10.0.0.9")) {
		t.Fatalf("a new generation kept the old ranges: %v", r)
	}
	c.keep(nil)
	if len(c.m) != 0 {
		t.Fatalf("%d pools kept after they were all deleted", len(c.m))
	}
}
