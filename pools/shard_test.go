package pools_test

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/vmipam/vmipam/pools"
)

// TestHolderLabelValue: a holder that is a valid label value (a pod's
// name) labels its objects as itself; any other holder gets a valid value
// of its own, the same every time and different from another holder's.
func TestHolderLabelValue(t *testing.T) {
	long := strings.Repeat("a", 64)
	for _, tt := range []struct {
		holder string
		same   bool
	}{
		{"vmipam-0", true},
		{"vmipam-7d9f8c6b5-x2x4q", true},
		{strings.Repeat("a", 63), true},
		{long, false},
		{long + "b", false},
		{"vmipam_controller.example/x", false},
		{"-leading", false},
	} {
		got := pools.HolderLabelValue(tt.holder)
		if errs := validation.IsValidLabelValue(got); len(errs) > 0 {
			t.Errorf("HolderLabelValue(%q) = %q, not a label value: %v", tt.holder, got, errs)
		}
		if (got == tt.holder) != tt.same {
			t.Errorf("HolderLabelValue(%q) = %q; want the holder itself: %t", tt.holder, got, tt.same)
		}
		if again := pools.HolderLabelValue(tt.holder); again != got {
			t.Errorf("HolderLabelValue(%q) = %q, then %q", tt.holder, got, again)
		}
	}
	if pools.HolderLabelValue(long) == pools.HolderLabelValue(long+"b") {
		t.Errorf("two long holders share the label value %q", pools.HolderLabelValue(long))
	}
}
