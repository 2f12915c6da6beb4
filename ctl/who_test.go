package ctl

import (
	"strings"
	"testing"
	"time"
)

// TestClaimLine: who says whose claim an address is, whether that replica
// is live and, for a holder slot, which pod holds it.
func TestClaimLine(t *testing.T) {
	renewed := time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		w    Who
		want []string
	}{
		{name: "no claim", w: Who{}, want: []string{"none"}},
		{name: "no Lease", w: Who{AddressState: AddressState{Claim: "slot-1"}}, want: []string{"slot-1", "no holder Lease"}},
		{name: "taken over", w: Who{AddressState: AddressState{Claim: "vmipam-abc"}, ClaimHolder: &Holder{Name: "vmipam-abc", TakenOverBy: "slot-0"}},
			want: []string{"vmipam-abc", "being taken over by slot-0"}},
		{name: "live slot", w: Who{AddressState: AddressState{Claim: "slot-1"}, ClaimHolder: &Holder{Name: "slot-1", Live: true, Renewed: renewed, Process: "vmipam-5d8f-x2"}},
			want: []string{"slot-1", "live", "pod vmipam-5d8f-x2"}},
		{name: "live pod-named holder", w: Who{AddressState: AddressState{Claim: "vmipam-abc"}, ClaimHolder: &Holder{Name: "vmipam-abc", Live: true, Renewed: renewed}},
			want: []string{"vmipam-abc (live, renewed"}},
		{name: "lapsed", w: Who{AddressState: AddressState{Claim: "slot-2"}, ClaimHolder: &Holder{Name: "slot-2", Renewed: renewed, Process: "gone"}},
			want: []string{"slot-2", "not live"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := claimLine(&tc.w)
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("claimLine = %q; want it to contain %q", got, w)
				}
			}
		})
	}
}
