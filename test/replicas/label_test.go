package replicas

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/pools"
	"github.com/vmipam/vmipam/test/harness"
)

// TestHolderLabelRepaired: each replica watches only the VMs labelled
// with its holder (and unlabelled ones), so a VM whose label a user
// removed, or set to another replica or to no replica at all, is seen by
// nobody who can release its address. The replica that claims the
// address puts its label back at its next resync (here every 3s), and a
// VM deleted while mislabelled goes once that happened, its address
// cooling down.
func TestHolderLabelRepaired(t *testing.T) {
	s := newSuite(t)
	const resync = 3 * time.Second
	s.startReplicas(2, "--resync-interval="+resync.String())
	prefix, _ := s.createPool(poolSpec{name: "labels", cidr: "10.90.0.0/26", cooldown: time.Minute, pendingTTL: time.Minute})
	const n = 8
	vms := make([]string, n)
	for i := range n {
		vms[i] = fmt.Sprintf("label-%d", i)
		if _, err := s.create(s.ctx, vms[i], "labels"); err != nil {
			t.Fatal(err)
		}
	}
	s.waitBound("labels", n, 30*time.Second)
	s.checkLabels("after the creates", "labels", prefix)

	// Three ways a label goes wrong, on VMs of either replica.
	others := map[string]string{}
	for _, rep := range s.rs.Live() {
		for _, o := range s.rs.Live() {
			if o != rep {
				others[pools.HolderLabelValue(rep.Holder)] = pools.HolderLabelValue(o.Holder)
			}
		}
	}
	// relabel sets name's holder label to the other replica's (other),
	// removes it (""), or sets it to value.
	const other = "<other>"
	relabel := func(name, value string) {
		t.Helper()
		vm := &vmipamv1.VirtualMachine{}
		if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: s.ns, Name: name}, vm); err != nil {
			t.Fatal(err)
		}
		v := "null"
		switch value {
		case "":
		case other:
			v = fmt.Sprintf("%q", others[vm.Labels[vmipamv1.HolderLabel]])
		default:
			v = fmt.Sprintf("%q", value)
		}
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, vmipamv1.HolderLabel, v)
		if err := s.c.Patch(s.ctx, vm, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
			t.Fatalf("relabel %s: %v", name, err)
		}
	}
	for i, name := range vms[:6] {
		relabel(name, []string{"", other, "nobody"}[i%3])
	}
	s.checkLabels("after labels were removed or changed", "labels", prefix)

	// Mislabelled, then deleted at once: it goes once its holder put the
	// label back, and its address cools down.
	victim := vms[7]
	vm := &vmipamv1.VirtualMachine{}
	if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: s.ns, Name: victim}, vm); err != nil {
		t.Fatal(err)
	}
	addr := vm.Spec.Addresses[0]
	relabel(victim, other)
	deleted := time.Now()
	if err := s.c.Delete(s.ctx, vm); err != nil {
		t.Fatal(err)
	}
	err := harness.Poll(s.ctx, 200*time.Millisecond, 4*resync+10*time.Second, func() error {
		err := s.c.Get(s.ctx, client.ObjectKey{Namespace: s.ns, Name: victim}, &vmipamv1.VirtualMachine{})
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return err
		}
		return errors.New("still there")
	})
	if err != nil {
		t.Fatalf("%s, deleted with another replica's label, %s: %v", victim, time.Since(deleted).Round(time.Second), err)
	}
	t.Logf("%s, deleted with another replica's label, was gone %s later", victim, time.Since(deleted).Round(100*time.Millisecond))
	static := &vmipamv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: "label-static"},
		Spec:       vmipamv1.VirtualMachineSpec{IPPool: "labels", Image: "replicas", CPUs: 1, Addresses: []string{addr}},
	}
	rctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	err = s.c.Create(rctx, static)
	if err == nil || !strings.Contains(err.Error(), "cools down until") {
		t.Errorf("EARLY REUSE: a static create of %s, released %s ago, got %v; want a refusal saying it cools down",
			addr, time.Since(deleted).Round(time.Second), err)
	}
	if a, err := netip.ParseAddr(addr); err != nil || !prefix.Contains(a) {
		t.Errorf("%s had %q, not an address of %s", victim, addr, prefix)
	}
}
