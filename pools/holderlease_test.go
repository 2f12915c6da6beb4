package pools

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/vmipam/vmipam/api/scheme"
	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/kinds"
)

func TestReadHolderLeases(t *testing.T) {
	now := time.Now()
	other := kinds.Kind{GVK: vmipamv1.GroupVersion.WithKind("Other"), Resource: "others", AddressField: []string{"spec", "ip"}}
	js := func(ks ...kinds.Kind) string {
		b, err := json.Marshal(ks)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	lease := func(holder, id string, renewed time.Duration, kindsJSON string) client.Object {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: LeaseName(holder), Labels: map[string]string{HolderLeaseLabel: "true"}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(id), LeaseDurationSeconds: ptr.To[int32](15)}}
		if renewed >= 0 {
			l.Spec.RenewTime = &metav1.MicroTime{Time: now.Add(-renewed)}
		}
		if kindsJSON != "" {
			l.Annotations = map[string]string{KindsAnnotation: kindsJSON}
		}
		return l
	}
	type want struct {
		live  bool
		taker string
		kinds []string
		err   string
	}
	tests := map[string]struct {
		l    client.Object
		want want
	}{
		"renewed 5s ago: live":          {l: lease("h", "h", 5*time.Second, js(other)), want: want{live: true, kinds: []string{"Other"}}},
		"renewed 14s ago: still live":   {l: lease("h", "h", 14*time.Second, ""), want: want{live: true}},
		"renewed 16s ago: lapsed":       {l: lease("h", "h", 16*time.Second, ""), want: want{}},
		"never renewed":                 {l: lease("h", "h", -1, ""), want: want{}},
		"released (empty identity)":     {l: lease("h", "", time.Second, ""), want: want{}},
		"being taken over by h2":        {l: lease("h", TakeoverPrefix+"h2", time.Second, ""), want: want{taker: "h2"}},
		"a takeover mark that lapsed":   {l: lease("h", TakeoverPrefix+"h2", time.Minute, ""), want: want{}},
		"garbage kinds name the holder": {l: lease("h", "h", time.Second, "{"), want: want{live: true, err: "holder h"}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(tt.l).Build()
			ls, err := ReadHolderLeases(t.Context(), c, "ns")
			if err != nil || len(ls) != 1 || ls[0].Holder != "h" {
				t.Fatalf("ReadHolderLeases = %+v, %v; want holder h", ls, err)
			}
			l := ls[0]
			taker, taken := l.TakenOverBy(now)
			var got []string
			for _, k := range l.Kinds {
				got = append(got, k.GVK.Kind)
			}
			if l.Live(now) != tt.want.live || taken != (tt.want.taker != "") || taker != tt.want.taker && taken || !slices.Equal(got, tt.want.kinds) {
				t.Errorf("live %t, taken over by %q (%t), kinds %v; want %+v", l.Live(now), taker, taken, got, tt.want)
			}
			if (l.KindsErr == nil) != (tt.want.err == "") || l.KindsErr != nil && !strings.Contains(l.KindsErr.Error(), tt.want.err) {
				t.Errorf("kinds error %v, want %q", l.KindsErr, tt.want.err)
			}
		})
	}
}

func TestKindsOf(t *testing.T) {
	now := time.Now()
	other := kinds.Kind{GVK: vmipamv1.GroupVersion.WithKind("Other"), Resource: "others", AddressField: []string{"spec", "ip"}}
	older := other
	older.AddressField = []string{"spec", "old"}
	tests := map[string]struct {
		ls   []HolderLease
		want []string
	}{
		"no Leases: the default":           {want: []string{"VirtualMachine"}},
		"one Lease":                        {ls: []HolderLease{{Holder: "a", Kinds: []kinds.Kind{other}}}, want: []string{"Other"}},
		"a Lease without kinds is skipped": {ls: []HolderLease{{Holder: "a"}, {Holder: "b", Kinds: []kinds.Kind{other}}}, want: []string{"Other"}},
		"the union, newest renewal first": {ls: []HolderLease{
			{Holder: "b", Renewed: now.Add(-time.Second), Kinds: []kinds.Kind{kinds.VirtualMachine, older}},
			{Holder: "a", Renewed: now, Kinds: []kinds.Kind{other}},
		}, want: []string{"Other", "VirtualMachine"}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			ks := KindsOf(tt.ls)
			var got []string
			for _, k := range ks {
				got = append(got, k.GVK.Kind)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("KindsOf = %v, want %v", got, tt.want)
			}
			if i := slices.IndexFunc(ks, func(k kinds.Kind) bool { return k.GVK.Kind == "Other" }); i >= 0 && ks[i].AddressField[1] != "ip" {
				t.Errorf("KindsOf took the older description of Other: %v", ks[i].AddressField)
			}
		})
	}
	// What a Lease publishes round-trips to a Kind that finds the address
	// where the configured one does.
	var back []kinds.Kind
	if raw, err := json.Marshal([]kinds.Kind{kinds.VirtualMachine}); err != nil || json.Unmarshal(raw, &back) != nil || len(back) != 1 || back[0].GVR() != kinds.VirtualMachine.GVR() {
		t.Errorf("round trip of the reference kind = %+v, %v", back, err)
	}
}
