package integration

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/history"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/test/harness"
)

// whoAmI is the test client's user name, as the API server sees it.
func whoAmI(t *testing.T) string {
	t.Helper()
	r := &authenticationv1.SelfSubjectReview{}
	if err := k8sClient.Create(t.Context(), r); err != nil {
		t.Fatalf("self subject review: %v", err)
	}
	return r.Status.UserInfo.Username
}

// askRelease creates an IPRelease of addr as the test client's user and
// returns it once a replica answered.
func askRelease(t *testing.T, addr string, skip bool, reason string) *vmipamv1.IPRelease {
	t.Helper()
	rel := &vmipamv1.IPRelease{ObjectMeta: metav1.ObjectMeta{GenerateName: "release-"},
		Spec: vmipamv1.IPReleaseSpec{Address: addr, SkipCooldown: skip, Reason: reason, RequestedBy: whoAmI(t)}}
	if err := k8sClient.Create(t.Context(), rel); err != nil {
		t.Fatalf("create IPRelease of %s: %v", addr, err)
	}
	harness.Eventually(t, 20*time.Second, "IPRelease of "+addr+" answered", func() error {
		if err := k8sClient.Get(t.Context(), client.ObjectKeyFromObject(rel), rel); err != nil {
			return err
		}
		if rel.Status.Phase == "" {
			return errors.New("no answer yet")
		}
		return nil
	})
	return rel
}

func wantAnswer(t *testing.T, rel *vmipamv1.IPRelease, phase string, says ...string) {
	t.Helper()
	if rel.Status.Phase != phase || rel.Status.Holder != "test" || rel.Status.CompletionTime == nil {
		t.Fatalf("IPRelease of %s: %+v; want %s, answered by holder test", rel.Spec.Address, rel.Status, phase)
	}
	for _, s := range says {
		if !strings.Contains(rel.Status.Message, s) {
			t.Fatalf("IPRelease of %s says %q; want it to say %q", rel.Spec.Address, rel.Status.Message, s)
		}
	}
}

// TestIPRelease: an operator's release is refused while an object holds
// the address and while a create may still be in flight, ends a pending
// reservation and (asked to) a cooldown, releases an address whose object
// vanished, and is recorded with who asked and why.
func TestIPRelease(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	v := startVMIPAM(t, clk)
	ns := namespace(t)
	newPool(t, v, "release", []vmipamv1.IPRange{{CIDR: "10.31.0.0/28"}}, func(p *vmipamv1.IPPool) {
		p.Spec.Cooldown.Duration = 10 * time.Minute
		p.Spec.PendingTTL.Duration = 5 * time.Minute
	})
	ctx := t.Context()
	user := whoAmI(t)

	// Nobody may sign for someone else.
	forged := &vmipamv1.IPRelease{ObjectMeta: metav1.ObjectMeta{GenerateName: "release-"},
		Spec: vmipamv1.IPReleaseSpec{Address: "10.31.0.3", RequestedBy: "someone-else"}}
	if err := k8sClient.Create(ctx, forged); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.requestedBy must name the user creating the IPRelease, "+user) {
		t.Fatalf("IPRelease signed for another user: %v; want it refused, naming %s", err, user)
	}
	noReason := &vmipamv1.IPRelease{ObjectMeta: metav1.ObjectMeta{GenerateName: "release-"},
		Spec: vmipamv1.IPReleaseSpec{Address: "10.31.0.3", SkipCooldown: true, RequestedBy: user}}
	if err := k8sClient.Create(ctx, noReason); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "skipCooldown needs a reason") {
		t.Fatalf("skipCooldown without a reason: %v; want it refused", err)
	}

	// A live VM's address is refused, naming the VM.
	held := vm(ns, "held", "release")
	if err := k8sClient.Create(ctx, held); err != nil {
		t.Fatal(err)
	}
	wantAnswer(t, askRelease(t, held.Spec.Addresses[0], true, "test"), vmipamv1.ReleaseRefused, "held by VirtualMachine "+ns+"/held")

	// A cooldown: kept unless asked to skip it, and not in its first
	// minute even then.
	if err := k8sClient.Delete(ctx, held); err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddr(held.Spec.Addresses[0])
	harness.Eventually(t, 10*time.Second, "held gone, its address cooling down", func() error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(held), &vmipamv1.VirtualMachine{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("held still there: %w", err)
		}
		if st, _, _ := v.reg.Get("release").Lookup(addr); st != ipam.StateCooldown {
			return fmt.Errorf("%s is %s", addr, st)
		}
		return nil
	})
	wantAnswer(t, askRelease(t, addr.String(), false, ""), vmipamv1.ReleaseRefused, "cools down until")
	wantAnswer(t, askRelease(t, addr.String(), true, "abuse ticket 7"), vmipamv1.ReleaseRefused, "try again after")
	clk.Step(ipam.InFlight + time.Second)
	rel := askRelease(t, addr.String(), true, "abuse ticket 7")
	wantAnswer(t, rel, vmipamv1.ReleaseDone, "ended the cooldown of "+addr.String()+": it is free")
	if st, _, _ := v.reg.Get("release").Lookup(addr); st != ipam.StateFree {
		t.Fatalf("%s is %s after its cooldown was ended; want free", addr, st)
	}
	recs, err := history.Read(ctx, k8sClient, addr)
	if err != nil {
		t.Fatal(err)
	}
	// vmipam's clock here is the test's, the objects' the API server's:
	// the records are found by what they ended, not by their order.
	ended := map[string]vmipamv1.AddressRecord{}
	for _, r := range recs {
		ended[r.Ended] = r
	}
	if e, h := ended[vmipamv1.EndedCooldown], ended[vmipamv1.EndedAllocated]; len(recs) != 2 || e.ReleasedBy != user || e.Reason != "abuse ticket 7" ||
		h.Name != "held" || h.UID != string(held.UID) {
		t.Fatalf("history of %s = %+v; want held's tenure and the early end by %s", addr, recs, user)
	}

	// A pending reservation: not while its create may be in flight, then
	// into its cooldown.
	pool := v.reg.Get("release")
	pend, err := pool.AllocateFamily(ctx, ipam.Reservation{Token: "stuck", Namespace: ns, Ref: ns + "/never-stored"}, vmipamv1.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	wantAnswer(t, askRelease(t, pend.String(), false, ""), vmipamv1.ReleaseRefused, "may still be stored")
	clk.Step(ipam.InFlight)
	wantAnswer(t, askRelease(t, pend.String(), false, "stuck"), vmipamv1.ReleaseDone, "ended the pending reservation of "+pend.String())
	if st, _, _ := pool.Lookup(pend); st != ipam.StateCooldown {
		t.Fatalf("%s is %s after its pending reservation was ended; want cooling down", pend, st)
	}
}
