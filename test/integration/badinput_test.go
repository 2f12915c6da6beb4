package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clocktesting "k8s.io/utils/clock/testing"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/test/harness"
)

// TestBadInput: malformed objects are refused at create time, by the
// schema or by vmipam's webhooks, with a message that names the field;
// nothing is reserved for them.
func TestBadInput(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	v := startVMIPAM(t, clk)
	ns := namespace(t)
	newPool(t, v, "bad", []vmipamv1.IPRange{{CIDR: "10.95.0.0/28"}, {CIDR: "fd00:95::/120"}})
	vmObj := func(spec map[string]any, meta map[string]any) *unstructured.Unstructured {
		m := map[string]any{"namespace": ns, "generateName": "bad-"}
		for k, v := range meta {
			m[k] = v
		}
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "vmipam.io/v1alpha1", "kind": "VirtualMachine", "metadata": m, "spec": spec,
		}}
	}
	poolObj := func(spec map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "vmipam.io/v1alpha1", "kind": "IPPool", "metadata": map[string]any{"generateName": "bad-"}, "spec": spec,
		}}
	}
	huge := strings.Repeat("x", 300*1024)
	tests := map[string]struct {
		obj  *unstructured.Unstructured
		want []string
	}{
		"VM: IPv6 typo":           {vmObj(map[string]any{"ipPool": "bad", "addresses": []any{"fd00:95::g"}}, nil), []string{"spec.addresses[0]", "not an IP address"}},
		"VM: outside its pool":    {vmObj(map[string]any{"ipPool": "bad", "addresses": []any{"fd00:96::1"}}, nil), []string{"spec.addresses[0]", "outside IPPool bad"}},
		"VM: addresses not list":  {vmObj(map[string]any{"ipPool": "bad", "addresses": "10.95.0.2"}, nil), []string{"spec.addresses:", "must be a list holding one IP address"}},
		"VM: cpus not a number":   {vmObj(map[string]any{"ipPool": "bad", "cpus": "two"}, nil), []string{"spec.cpus", "integer"}},
		"VM: two IPv4 addresses":  {vmObj(map[string]any{"ipPool": "bad", "addresses": []any{"10.95.0.2", "10.95.0.3"}}, nil), []string{"spec.addresses[1]", "a second IPv4 address"}},
		"VM: three addresses":     {vmObj(map[string]any{"ipPool": "bad", "addresses": []any{"10.95.0.2", "fd00::3", "10.95.0.4"}}, nil), []string{"spec.addresses", "must have at most 2 items"}},
		"VM: an unknown policy":   {vmObj(map[string]any{"ipPool": "bad", "ipFamilyPolicy": "Dual"}, nil), []string{"spec.ipFamilyPolicy", "Unsupported value"}},
		"VM: huge annotation":     {vmObj(map[string]any{"ipPool": "bad"}, map[string]any{"annotations": map[string]any{"note": huge}}), []string{"metadata.annotations", "Too long"}},
		"VM: unknown pool":        {vmObj(map[string]any{"ipPool": "nope"}, nil), []string{"spec.ipPool", `IPPool "nope" does not exist`}},
		"pool: IPv6 typo":         {poolObj(map[string]any{"ranges": []any{map[string]any{"cidr": "fd00:97::/120", "first": "fd00:97::g"}}}), []string{"spec.ranges[0].first", "must be an IP address"}},
		"pool: exclude elsewhere": {poolObj(map[string]any{"ranges": []any{map[string]any{"cidr": "10.96.0.0/24", "exclude": []any{"10.97.0.1"}}}}), []string{"spec.ranges[0].exclude[0]", "outside the range's CIDR"}},
		"pool: overlaps a pool":   {poolObj(map[string]any{"ranges": []any{map[string]any{"cidr": "fd00:95::/112"}}}), []string{"spec.ranges[0].cidr", `IPPool "bad"`}},
		"pool: ranges not a list": {poolObj(map[string]any{"ranges": "10.96.0.0/24"}), []string{"spec.ranges", "array"}},
		"pool: no ranges":         {poolObj(map[string]any{"ranges": []any{}}), []string{"spec.ranges", "at least 1"}},
		"pool: cooldown not a duration": {poolObj(map[string]any{"ranges": []any{map[string]any{"cidr": "10.98.0.0/24"}}, "cooldown": 5}),
			[]string{"spec.cooldown", "string"}},
	}
	before := v.reg.Get("bad").Snapshot()
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := k8sClient.Create(t.Context(), tc.obj)
			if err == nil {
				t.Fatalf("created %s; want a refusal", tc.obj.GetName())
			}
			if !apierrors.IsInvalid(err) && !apierrors.IsBadRequest(err) && !apierrors.IsRequestEntityTooLargeError(err) {
				t.Errorf("refused with %v, want Invalid", apierrors.ReasonForError(err))
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	// The schema checks types and sizes after the mutating webhook ran, so
	// a create refused there leaves a reservation behind; it lapses after
	// the pending TTL (into cooldown), and nothing was ever allocated.
	m := v.reg.Get("bad")
	if after := m.Snapshot(); after.Allocated != before.Allocated {
		t.Fatalf("refused creates allocated addresses: %+v -> %+v", before, after)
	}
	clk.Step(time.Minute)
	harness.Eventually(t, 10*time.Second, "the reservations of refused creates to lapse", func() error {
		if c := m.Snapshot(); c.Pending != 0 {
			return fmt.Errorf("%d still pending", c.Pending)
		}
		return nil
	})
}
