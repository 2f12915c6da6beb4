package harness_test

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/test/harness"
)

// TestLedger checks the ledger's rules without a control plane: a second
// holder of an address whose first holder was never deleted is a
// duplicate; one answered before the first holder's delete was issued plus
// the cooldown is an early reuse; one created before the first holder was
// seen gone plus the cooldown, less 2s, is a late-rule reuse; one after
// both is fine.
func TestLedger(t *testing.T) {
	const cooldown = 10 * time.Second
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	vm := func(name, addr string, created time.Time) *vmipamv1.VirtualMachine {
		return &vmipamv1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)},
			Spec:       vmipamv1.VirtualMachineSpec{Addresses: []string{addr}},
		}
	}
	for _, tc := range []struct {
		name string
		// deleted is when the first holder's delete was issued (zero:
		// never), gone when it was seen gone; second is when the second
		// holder's create was answered and its creationTimestamp.
		deleted, gone, second time.Duration
		want, wantLate        string
	}{
		{name: "never deleted", second: time.Second, want: "DUPLICATE"},
		{name: "inside the cooldown", deleted: time.Second, gone: 2 * time.Second, second: 5 * time.Second, want: "EARLY REUSE", wantLate: "seen gone"},
		{name: "late rule only", deleted: time.Second, gone: 8 * time.Second, second: 12 * time.Second, wantLate: "seen gone"},
		{name: "after the cooldown", deleted: time.Second, gone: 2 * time.Second, second: 13 * time.Second},
		{name: "outside the pool", second: time.Second, want: "BAD ADDRESS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := harness.NewLedger(cooldown, 1, harness.Prefixes{netip.MustParsePrefix("10.0.0.0/24")})
			first := &harness.Record{Name: "first", Sent: t0, Resp: t0}
			l.Created(first, vm("first", "10.0.0.5", t0))
			if tc.deleted > 0 {
				first.DeleteIssued = t0.Add(tc.deleted)
			}
			addr := "10.0.0.5"
			if tc.want == "BAD ADDRESS" {
				addr = "10.1.0.5"
			}
			at := t0.Add(tc.second)
			l.Created(&harness.Record{Name: "second", Sent: at, Resp: at}, vm("second", addr, at))
			got := strings.Join(l.Problems(), "\n")
			if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
				t.Errorf("problems %q, want %q", got, tc.want)
			}
			goneAt := func(name string) (time.Time, bool) {
				return t0.Add(tc.gone), name == "first" && tc.gone > 0
			}
			late, _, _ := l.LateReuse(goneAt)
			if gotLate := strings.Join(late, "\n"); tc.wantLate == "" && gotLate != "" || !strings.Contains(gotLate, tc.wantLate) {
				t.Errorf("late-rule violations %q, want %q", gotLate, tc.wantLate)
			}
		})
	}
}

// TestLedgerDualStack: with a prefix per family, a VM must carry one
// address of each, and a second holder of either address is judged as in
// a single family.
func TestLedgerDualStack(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		addrs []string
		want  string
	}{
		{name: "both new", addrs: []string{"10.0.0.6", "fd00::6"}},
		{name: "the IPv6 address held", addrs: []string{"10.0.0.6", "fd00::5"}, want: "DUPLICATE: fd00::5"},
		{name: "one family only", addrs: []string{"10.0.0.6"}, want: "NO ADDRESS"},
		{name: "two of one family", addrs: []string{"10.0.0.6", "10.0.0.7"}, want: "BAD ADDRESS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := harness.NewLedger(time.Second, 2, harness.Prefixes{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("fd00::/120")})
			first := &harness.Record{Name: "first", Sent: t0, Resp: t0}
			l.Created(first, &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: "first"},
				Spec: vmipamv1.VirtualMachineSpec{Addresses: []string{"10.0.0.5", "fd00::5"}}})
			at := t0.Add(time.Second)
			l.Created(&harness.Record{Name: "second", Sent: at, Resp: at}, &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: "second"},
				Spec: vmipamv1.VirtualMachineSpec{Addresses: tc.addrs}})
			got := strings.Join(l.Problems(), "\n")
			if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
				t.Errorf("problems %q, want %q", got, tc.want)
			}
		})
	}
}
