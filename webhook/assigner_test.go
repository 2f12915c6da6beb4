package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/pools"
	"github.com/vmipam/vmipam/test/fixture"
)

// vmJSON is a VirtualMachine as the API server sends it, with extra
// metadata and spec fields merged in.
func vmJSON(t testing.TB, meta map[string]any, spec map[string]any) []byte {
	t.Helper()
	md := map[string]any{"name": "vm-1", "namespace": "team-a"}
	for k, v := range meta {
		if v == nil {
			delete(md, k)
			continue
		}
		md[k] = v
	}
	obj := map[string]any{"apiVersion": "vmipam.io/v1alpha1", "kind": "VirtualMachine", "metadata": md}
	if spec != nil {
		obj["spec"] = spec
	}
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func vmRequest(op admissionv1.Operation, obj []byte, edit ...func(*admission.Request)) admission.Request {
	r := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "req-1", Operation: op, Namespace: "team-a", Name: "vm-1",
		Kind:     metav1.GroupVersionKind{Group: "vmipam.io", Version: "v1alpha1", Kind: "VirtualMachine"},
		Resource: metav1.GroupVersionResource{Group: "vmipam.io", Version: "v1alpha1", Resource: "virtualmachines"},
		UserInfo: authenticationv1.UserInfo{Username: "alice"},
		Object:   runtime.RawExtension{Raw: obj},
	}}
	for _, f := range edit {
		f(&r)
	}
	return r
}

// applied returns obj with the response's patch applied, decoded.
func applied(t *testing.T, obj []byte, resp admission.Response) map[string]any {
	t.Helper()
	return fixture.Patched(t, obj, resp.Patches)
}

func annotations(obj map[string]any) map[string]any {
	md, _ := obj["metadata"].(map[string]any)
	a, _ := md["annotations"].(map[string]any)
	return a
}

// TestAssigner drives the mutating handler through its decisions. Each
// row says whether the create is allowed, what the denial says, and how
// many addresses it may reserve: none on any refusal.
func TestAssigner(t *testing.T) {
	type row struct {
		obj      []byte
		edit     func(*admission.Request)
		allowed  bool
		code     int32
		message  []string
		reserves int
		check    func(t *testing.T, obj map[string]any)
	}
	dyn := vmJSON(t, nil, map[string]any{"image": "debian"})
	tests := map[string]row{
		"dynamic": {obj: dyn, allowed: true, reserves: 1, check: func(t *testing.T, o map[string]any) {
			a := annotations(o)
			if a[vmipamv1.PoolAnnotation] != "fuzz" || a[vmipamv1.TokenAnnotation] == "" {
				t.Errorf("annotations %v", a)
			}
			spec := o["spec"].(map[string]any)
			if addrs, _ := spec["addresses"].([]any); len(addrs) != 1 || !strings.HasPrefix(addrs[0].(string), "10.0.0.") || spec["image"] != "debian" {
				t.Errorf("spec %v", spec)
			}
			if f, _ := o["metadata"].(map[string]any)["finalizers"].([]any); len(f) != 1 || f[0] != vmipamv1.Finalizer {
				t.Errorf("finalizers %v", f)
			}
			if addrs, _ := spec["addresses"].([]any); len(addrs) == 1 {
				stampedAs(addrs[0].(string))(t, o)
			}
		}},
		"no spec, no metadata beyond the name": {obj: []byte(`{"apiVersion":"vmipam.io/v1alpha1","kind":"VirtualMachine","metadata":{"name":"vm-1"}}`),
			allowed: true, reserves: 1},
		"no metadata at all": {obj: []byte(`{"apiVersion":"vmipam.io/v1alpha1","kind":"VirtualMachine"}`), allowed: true, reserves: 1,
			check: func(t *testing.T, o map[string]any) {
				if annotations(o)[vmipamv1.TokenAnnotation] == "" {
					t.Errorf("no token stamped: %v", o)
				}
			}},
		"keeps other annotations and finalizers": {obj: vmJSON(t, map[string]any{"annotations": map[string]any{"a/b~c": "x"}, "finalizers": []any{"other"}}, nil),
			allowed: true, reserves: 1, check: func(t *testing.T, o map[string]any) {
				if annotations(o)["a/b~c"] != "x" {
					t.Errorf("lost an annotation: %v", annotations(o))
				}
				if f := o["metadata"].(map[string]any)["finalizers"].([]any); len(f) != 2 || f[0] != "other" {
					t.Errorf("finalizers %v", f)
				}
			}},
		"static": {obj: vmJSON(t, nil, map[string]any{"addresses": []any{"10.0.0.7"}}), allowed: true, reserves: 1, check: stampedAs("10.0.0.7")},
		"static with its prefix length": {obj: vmJSON(t, nil, map[string]any{"addresses": []any{"10.0.0.7/24"}}), allowed: true, reserves: 1,
			check: stampedAs("10.0.0.7")},
		"static with another prefix length": {obj: vmJSON(t, nil, map[string]any{"addresses": []any{"10.0.0.7/16"}}),
			code: http.StatusUnprocessableEntity, message: []string{"spec.addresses[0]", "/16 differs from the subnet 10.0.0.0/24 of IPPool fuzz", "write 10.0.0.7/24"}},
		"static, a bad prefix length": {obj: vmJSON(t, nil, map[string]any{"addresses": []any{"10.0.0.7/33"}}),
			code: http.StatusUnprocessableEntity, message: []string{"spec.addresses[0]", "address with its prefix length such as 10.0.0.5/24"}},
		"static, IPv4-mapped with a prefix length": {obj: vmJSON(t, nil, map[string]any{"addresses": []any{"::ffff:10.0.0.7/120"}}),
			code: http.StatusUnprocessableEntity, message: []string{"spec.addresses[0]", "IPv4-mapped", "write it as 10.0.0.7/24"}},
		"static, the gateway": {obj: vmJSON(t, nil, map[string]any{"addresses": []any{"10.0.0.1"}}),
			code: http.StatusUnprocessableEntity, message: []string{"spec.addresses[0]", "is the gateway or a route's next hop of IPPool fuzz"}},
		"dry run, static with its prefix length": {obj: vmJSON(t, nil, map[string]any{"addresses": []any{"10.0.0.7/24"}}),
			edit: func(r *admission.Request) { r.DryRun = ptr.To(true) }, allowed: true,
			check: func(t *testing.T, o map[string]any) {
				if addrs := o["spec"].(map[string]any)["addresses"].([]any); len(addrs) != 1 || addrs[0] != "10.0.0.7" {
					t.Errorf("dry run left spec.addresses %v; want [10.0.0.7], as the create would store it", addrs)
				}
			}},
		"static, IPv4-mapped": {obj: vmJSON(t, nil, map[string]any{"addresses": []any{"::ffff:10.0.0.7"}}),
			code: http.StatusUnprocessableEntity, message: []string{"spec.addresses[0]", "IPv4-mapped", "write it as 10.0.0.7"}},
		"static, zoned": {obj: vmJSON(t, nil, map[string]any{"addresses": []any{"10.0.0.7%eth0"}}),
			code: http.StatusUnprocessableEntity, message: []string{"spec.addresses[0]", "not an IP address"}},
		"static, outside": {obj: vmJSON(t, nil, map[string]any{"addresses": []any{"10.9.0.7"}}),
			code: http.StatusUnprocessableEntity, message: []string{"outside IPPool fuzz", "10.0.0.2-10.0.0.253"}},
		"two addresses of one family": {obj: vmJSON(t, nil, map[string]any{"addresses": []any{"10.0.0.7", "10.0.0.8"}}),
			code: http.StatusUnprocessableEntity, message: []string{"spec.addresses[1]", "a second IPv4 address (with 10.0.0.7)"}},
		"three addresses": {obj: vmJSON(t, nil, map[string]any{"addresses": []any{"10.0.0.7", "fd00::8", "10.0.0.9"}}),
			code: http.StatusUnprocessableEntity, message: []string{"spec.addresses", "must have at most 2 items"}},
		"an address of each family, single-stack": {obj: vmJSON(t, nil, map[string]any{"addresses": []any{"10.0.0.7", "fd00::8"}}),
			code: http.StatusUnprocessableEntity, message: []string{"spec.ipFamilyPolicy", "holds an address of each family: set spec.ipFamilyPolicy to PreferDualStack or RequireDualStack"}},
		"dual-stack required of an IPv4 pool": {obj: vmJSON(t, nil, map[string]any{"ipFamilyPolicy": "RequireDualStack"}),
			code: http.StatusUnprocessableEntity, message: []string{"spec.ipFamilyPolicy", "IPPool fuzz has no IPv6 range"}},
		"dual-stack preferred of an IPv4 pool": {obj: vmJSON(t, nil, map[string]any{"ipFamilyPolicy": "PreferDualStack"}), allowed: true, reserves: 1,
			check: func(t *testing.T, o map[string]any) {
				if a := annotations(o); a[vmipamv1.SingleStackAnnotation] != "IPPool fuzz has no IPv6 range" {
					t.Errorf("annotations %v: want %s saying why", a, vmipamv1.SingleStackAnnotation)
				}
			}},
		"IPv6 asked of an IPv4 pool": {obj: vmJSON(t, nil, map[string]any{"ipFamilies": []any{"IPv6"}}),
			code: http.StatusUnprocessableEntity, message: []string{"spec.ipFamilies[0]", "IPPool fuzz has no IPv6 range"}},
		"an unknown policy": {obj: vmJSON(t, nil, map[string]any{"ipFamilyPolicy": "DualStack"}),
			code: http.StatusUnprocessableEntity, message: []string{"spec.ipFamilyPolicy", "Unsupported value"}},
		"a family twice": {obj: vmJSON(t, nil, map[string]any{"ipFamilies": []any{"IPv4", "IPv4"}}),
			code: http.StatusUnprocessableEntity, message: []string{"spec.ipFamilies[1]", "Duplicate"}},
		"addresses not a list": {obj: vmJSON(t, nil, map[string]any{"addresses": "10.0.0.7"}),
			code: http.StatusUnprocessableEntity, message: []string{"spec.addresses", "must be a list holding one IP address"}},
		"pool not a string": {obj: vmJSON(t, nil, map[string]any{"ipPool": 7}),
			code: http.StatusUnprocessableEntity, message: []string{"spec.ipPool", "must be a string"}},
		"unknown pool": {obj: vmJSON(t, nil, map[string]any{"ipPool": "nope"}),
			code: http.StatusUnprocessableEntity, message: []string{"spec.ipPool", `IPPool "nope" does not exist`}},
		"dry run": {obj: dyn, edit: func(r *admission.Request) { r.DryRun = ptr.To(true) }, allowed: true,
			check: func(t *testing.T, o map[string]any) {
				if a := annotations(o); a[vmipamv1.PoolAnnotation] != "fuzz" || a[vmipamv1.TokenAnnotation] != nil {
					t.Errorf("dry run annotations %v", a)
				}
			}},
		"dry run drops a copied token": {obj: vmJSON(t, map[string]any{"annotations": map[string]any{vmipamv1.TokenAnnotation: "copied"}}, nil),
			edit: func(r *admission.Request) { r.DryRun = ptr.To(true) }, allowed: true,
			check: func(t *testing.T, o map[string]any) {
				if _, ok := annotations(o)[vmipamv1.TokenAnnotation]; ok {
					t.Errorf("dry run kept the token: %v", annotations(o))
				}
			}},
		"a copied token is replaced": {obj: vmJSON(t, map[string]any{"annotations": map[string]any{vmipamv1.TokenAnnotation: "copied", vmipamv1.PoolAnnotation: "fuzz"}}, nil),
			allowed: true, reserves: 1, check: func(t *testing.T, o map[string]any) {
				if annotations(o)[vmipamv1.TokenAnnotation] == "copied" {
					t.Error("kept a copied token")
				}
			}},
		"wrong kind":        {obj: dyn, edit: func(r *admission.Request) { r.Kind.Kind = "Pod" }, code: http.StatusBadRequest, message: []string{"serves virtualmachines.vmipam.io"}},
		"wrong resource":    {obj: dyn, edit: func(r *admission.Request) { r.Resource.Resource = "pods" }, code: http.StatusBadRequest, message: []string{"not pods"}},
		"a subresource":     {obj: dyn, edit: func(r *admission.Request) { r.SubResource = "status" }, code: http.StatusBadRequest, message: []string{"/status"}},
		"delete":            {obj: dyn, edit: func(r *admission.Request) { r.Operation = admissionv1.Delete }, allowed: true},
		"empty object":      {obj: []byte(`{}`), code: http.StatusBadRequest, message: []string{`not a vmipam.io/v1alpha1 VirtualMachine`}},
		"not an object":     {obj: []byte(`[{},{}]`), code: http.StatusBadRequest, message: []string{"not a JSON object"}},
		"no object":         {obj: nil, code: http.StatusBadRequest, message: []string{"carries no VirtualMachine"}},
		"another namespace": {obj: vmJSON(t, map[string]any{"namespace": "team-b"}, nil), code: http.StatusBadRequest, message: []string{`namespace "team-b" differs`}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			reg, _, _ := newTestRegistry(t, "10.0.0.0/24", func(p *vmipamv1.IPPool) {
				p.Spec.Ranges[0].Gateway = "10.0.0.1"
				p.Spec.Ranges[0].Routes = []vmipamv1.Route{{Destination: "10.200.0.0/16"}, {Destination: "10.201.0.0/16", Via: "10.0.0.254"}}
			})
			d := &Assigner{Registry: reg, Kind: kinds.VirtualMachine}
			req := vmRequest(admissionv1.Create, tc.obj)
			if tc.edit != nil {
				tc.edit(&req)
			}
			before := reg.Get("fuzz").Snapshot()
			resp := d.Handle(t.Context(), req)
			if resp.Allowed != tc.allowed {
				t.Fatalf("allowed = %t, want %t: %+v", resp.Allowed, tc.allowed, resp.Result)
			}
			if !tc.allowed {
				if resp.Result == nil || resp.Result.Code != tc.code {
					t.Fatalf("result %+v, want code %d", resp.Result, tc.code)
				}
				for _, w := range tc.message {
					if !strings.Contains(resp.Result.Message, w) {
						t.Errorf("message %q does not contain %q", resp.Result.Message, w)
					}
				}
			}
			after := reg.Get("fuzz").Snapshot()
			if got := (after.Pending + after.Allocated) - (before.Pending + before.Allocated); got != tc.reserves {
				t.Errorf("reserved %d addresses, want %d", got, tc.reserves)
			}
			if tc.check != nil {
				tc.check(t, applied(t, tc.obj, resp))
			}
		})
	}
}

// stampedAs checks that a VirtualMachine was stamped with addr alone in
// spec.addresses, and with its network identity in spec.network: the
// address in interface notation, the test pool's gateway and its routes.
func stampedAs(addr string) func(t *testing.T, o map[string]any) {
	return func(t *testing.T, o map[string]any) {
		t.Helper()
		spec := o["spec"].(map[string]any)
		if addrs, _ := spec["addresses"].([]any); len(addrs) != 1 || addrs[0] != addr {
			t.Errorf("spec.addresses = %v, want [%s]", spec["addresses"], addr)
		}
		raw, _ := json.Marshal(spec["network"])
		var got vmipamv1.Network
		if err := json.Unmarshal(raw, &got); err != nil {
			t.Fatalf("spec.network %s: %v", raw, err)
		}
		want := vmipamv1.Network{Addresses: []string{addr + "/24"}, Gateways: []string{"10.0.0.1"}, Routes: []vmipamv1.Route{
			{Destination: "10.200.0.0/16", Via: "10.0.0.1"}, {Destination: "10.201.0.0/16", Via: "10.0.0.254"}}}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("spec.network = %s, want %+v", raw, want)
		}
	}
}

// TestAssignerCopiedStamp: the API server calls the assigner once per
// admission, so a stamp already on an object was copied from another one:
// its address is a static request like any other, refused while the first
// object's reservation holds it, and its token is replaced.
func TestAssignerCopiedStamp(t *testing.T) {
	reg, _, _ := newTestRegistry(t, "10.0.0.0/24")
	d := &Assigner{Registry: reg, Kind: kinds.VirtualMachine}
	obj := vmJSON(t, map[string]any{"name": nil, "generateName": "db-"}, nil)
	first := d.Handle(t.Context(), vmRequest(admissionv1.Create, obj, func(r *admission.Request) { r.Name = "" }))
	if !first.Allowed {
		t.Fatalf("first create: %+v", first.Result)
	}
	stampedObj := applied(t, obj, first)
	stamped, err := json.Marshal(stampedObj)
	if err != nil {
		t.Fatal(err)
	}
	copied := d.Handle(t.Context(), vmRequest(admissionv1.Create, stamped, func(r *admission.Request) { r.UserInfo.Username = "mallory" }))
	if copied.Allowed || !strings.Contains(copied.Result.Message, "reserved for team-a/db-*") {
		t.Fatalf("a copied stamp: %+v, want refused naming team-a/db-*", copied.Result)
	}
	// Without the address, the copy gets an address and a token of its own.
	delete(stampedObj, "spec")
	bare, err := json.Marshal(stampedObj)
	if err != nil {
		t.Fatal(err)
	}
	fresh := d.Handle(t.Context(), vmRequest(admissionv1.Create, bare))
	if !fresh.Allowed {
		t.Fatalf("a copy without its address: %+v", fresh.Result)
	}
	got := applied(t, bare, fresh)
	if annotations(got)[vmipamv1.TokenAnnotation] == annotations(stampedObj)[vmipamv1.TokenAnnotation] {
		t.Error("kept the copied token")
	}
	if annotations(got)[vmipamv1.AddressAnnotation] == annotations(stampedObj)[vmipamv1.AddressAnnotation] {
		t.Error("stamped the first object's address again")
	}
	if c := reg.Get("fuzz").Snapshot(); c.Pending != 2 {
		t.Fatalf("%d pending, want 2", c.Pending)
	}
}

// TestAssignerBounds: a namespace's pending reservations are bounded,
// and a pool restricted to some namespaces refuses the others.
func TestAssignerBounds(t *testing.T) {
	reg, _, _ := newTestRegistry(t, "10.0.0.0/24", func(p *vmipamv1.IPPool) {
		p.Spec.MaxPendingPerNamespace = ptr.To(int32(2))
		p.Spec.AllowedNamespaces = &vmipamv1.NamespaceRestriction{Names: []string{"team-a"}}
	})
	d := &Assigner{Registry: reg, Kind: kinds.VirtualMachine}
	for i, want := range []bool{true, true, false} {
		resp := d.Handle(t.Context(), vmRequest(admissionv1.Create, vmJSON(t, map[string]any{"name": nil, "generateName": "x-"}, nil)))
		if resp.Allowed != want {
			t.Fatalf("create %d: allowed %t, want %t (%+v)", i, resp.Allowed, want, resp.Result)
		}
		if !want && (resp.Result.Code != http.StatusTooManyRequests || !strings.Contains(resp.Result.Message, "namespace team-a already has 2 reservations")) {
			t.Fatalf("refusal %+v", resp.Result)
		}
	}
	resp := d.Handle(t.Context(), vmRequest(admissionv1.Create, vmJSON(t, map[string]any{"namespace": "team-b"}, nil),
		func(r *admission.Request) { r.Namespace = "team-b" }))
	if resp.Allowed || resp.Result.Code != http.StatusForbidden || !strings.Contains(resp.Result.Message, "team-b is not one of them") {
		t.Fatalf("another namespace: %+v", resp.Result)
	}
	if c := reg.Get("fuzz").Snapshot(); c.Pending != 2 {
		t.Fatalf("%d pending, want 2", c.Pending)
	}
}

// TestStampGuard covers the immutability checks and the CREATE check of
// the address vmipam reserved.
func TestStampGuard(t *testing.T) {
	stamp := map[string]any{vmipamv1.TokenAnnotation: "tok", vmipamv1.PoolAnnotation: "fuzz", vmipamv1.AddressAnnotation: "10.0.0.9"}
	unstamped := map[string]any{vmipamv1.TokenAnnotation: "tok", vmipamv1.PoolAnnotation: "fuzz"}
	held := vmJSON(t, map[string]any{"annotations": stamp}, map[string]any{"addresses": []any{"10.0.0.9"}})
	moved := vmJSON(t, map[string]any{"annotations": stamp}, map[string]any{"addresses": []any{"10.0.0.10"}})
	v := &StampGuard{Kind: kinds.VirtualMachine}
	tests := map[string]struct {
		req     admission.Request
		allowed bool
		message string
	}{
		"create as reserved":              {vmRequest(admissionv1.Create, held), true, ""},
		"create, address changed":         {vmRequest(admissionv1.Create, moved), false, "differs from the address vmipam reserved"},
		"create, address stamp removed":   {vmRequest(admissionv1.Create, vmJSON(t, map[string]any{"annotations": unstamped}, map[string]any{"addresses": []any{"10.0.0.9"}})), false, vmipamv1.AddressAnnotation},
		"create, dry run":                 {vmRequest(admissionv1.Create, moved, func(r *admission.Request) { r.DryRun = ptr.To(true) }), true, ""},
		"update, address stamp changed":   {vmRequest(admissionv1.Update, vmJSON(t, map[string]any{"annotations": map[string]any{vmipamv1.TokenAnnotation: "tok", vmipamv1.PoolAnnotation: "fuzz", vmipamv1.AddressAnnotation: "10.0.0.10"}}, map[string]any{"addresses": []any{"10.0.0.9"}}), func(r *admission.Request) { r.OldObject.Raw = held }), false, vmipamv1.AddressAnnotation},
		"update, address changed":         {vmRequest(admissionv1.Update, moved, func(r *admission.Request) { r.OldObject.Raw = held }), false, "is immutable once assigned"},
		"update, address unchanged":       {vmRequest(admissionv1.Update, held, func(r *admission.Request) { r.OldObject.Raw = held }), true, ""},
		"update, address respelled":       {vmRequest(admissionv1.Update, vmJSON(t, map[string]any{"annotations": stamp}, map[string]any{"addresses": []any{"::ffff:10.0.0.9"}}), func(r *admission.Request) { r.OldObject.Raw = held }), false, "immutable"},
		"update, token changed":           {vmRequest(admissionv1.Update, vmJSON(t, map[string]any{"annotations": map[string]any{vmipamv1.TokenAnnotation: "x", vmipamv1.PoolAnnotation: "fuzz", vmipamv1.AddressAnnotation: "10.0.0.9"}}, map[string]any{"addresses": []any{"10.0.0.9"}}), func(r *admission.Request) { r.OldObject.Raw = held }), false, "vmipam.io/token"},
		"update, address out of thin air": {vmRequest(admissionv1.Update, vmJSON(t, nil, map[string]any{"addresses": []any{"10.0.0.20"}}), func(r *admission.Request) { r.OldObject.Raw = vmJSON(t, nil, nil) }), false, "assigned by vmipam"},
		"wrong resource":                  {vmRequest(admissionv1.Create, held, func(r *admission.Request) { r.Resource.Resource = "pods" }), false, "serves virtualmachines"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			resp := v.Handle(context.Background(), tc.req)
			if resp.Allowed != tc.allowed {
				t.Fatalf("allowed = %t, want %t: %+v", resp.Allowed, tc.allowed, resp.Result)
			}
			if !tc.allowed && !strings.Contains(resp.Result.Message, tc.message) {
				t.Errorf("message %q does not contain %q", resp.Result.Message, tc.message)
			}
		})
	}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

// TestAssignerDualStack: over a pool of both families, a create gets an
// address of each family it asks for, in its order, under one token; a
// RequireDualStack create that cannot get one family gets nothing (the
// other family's reservation goes back at once), a PreferDualStack one
// gets what it can and says so; static requests name either family or
// both.
func TestAssignerDualStack(t *testing.T) {
	type row struct {
		spec map[string]any
		// fillV6 takes every IPv6 address (fd00::1 to fd00::7) first.
		fillV6  bool
		code    int32
		message string
		// want are the families of the addresses stamped, in order; the
		// statics among them are the addresses given.
		want    []string
		statics []string
		note    bool
	}
	tests := map[string]row{
		"single-stack by default":       {spec: map[string]any{}, want: []string{"IPv4"}},
		"single-stack IPv6":             {spec: map[string]any{"ipFamilies": []any{"IPv6"}}, want: []string{"IPv6"}},
		"required":                      {spec: map[string]any{"ipFamilyPolicy": "RequireDualStack"}, want: []string{"IPv4", "IPv6"}},
		"required, IPv6 first":          {spec: map[string]any{"ipFamilyPolicy": "RequireDualStack", "ipFamilies": []any{"IPv6"}}, want: []string{"IPv6", "IPv4"}},
		"preferred":                     {spec: map[string]any{"ipFamilyPolicy": "PreferDualStack"}, want: []string{"IPv4", "IPv6"}},
		"required, IPv6 exhausted":      {spec: map[string]any{"ipFamilyPolicy": "RequireDualStack"}, fillV6: true, code: http.StatusForbidden, message: `pool "dual" has no IPv6 address left: 0 of 7 usable IPv6 addresses allocated, 7 pending`},
		"preferred, IPv6 exhausted":     {spec: map[string]any{"ipFamilyPolicy": "PreferDualStack"}, fillV6: true, want: []string{"IPv4"}, note: true},
		"preferred IPv6, exhausted":     {spec: map[string]any{"ipFamilyPolicy": "PreferDualStack", "ipFamilies": []any{"IPv6", "IPv4"}}, fillV6: true, want: []string{"IPv4"}, note: true},
		"static pair":                   {spec: map[string]any{"ipFamilyPolicy": "RequireDualStack", "addresses": []any{"fd00::6", "10.0.0.6"}}, want: []string{"IPv6", "IPv4"}, statics: []string{"fd00::6", "10.0.0.6"}},
		"static pair with lengths":      {spec: map[string]any{"ipFamilyPolicy": "PreferDualStack", "addresses": []any{"10.0.0.6/24", "fd00::6/125"}}, want: []string{"IPv4", "IPv6"}, statics: []string{"10.0.0.6", "fd00::6"}},
		"static IPv6 alone":             {spec: map[string]any{"addresses": []any{"fd00::6"}}, want: []string{"IPv6"}, statics: []string{"fd00::6"}},
		"static IPv4, IPv6 given":       {spec: map[string]any{"ipFamilyPolicy": "RequireDualStack", "addresses": []any{"10.0.0.6"}}, want: []string{"IPv4", "IPv6"}, statics: []string{"10.0.0.6"}},
		"static IPv6 behind IPv4 first": {spec: map[string]any{"ipFamilies": []any{"IPv4"}, "addresses": []any{"fd00::6"}}, code: http.StatusUnprocessableEntity, message: "an IPv6 address, but spec.ipFamilies puts IPv4 first"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			reg, _, _ := newTestRegistry(t, "10.0.0.0/24", func(p *vmipamv1.IPPool) {
				p.Name = "dual"
				p.Spec.Ranges = append(p.Spec.Ranges, vmipamv1.IPRange{CIDR: "fd00::/125"})
			})
			pool := reg.Get("dual")
			if tc.fillV6 {
				for i := range 7 {
					if _, err := pool.AllocateFamily(t.Context(), ipam.Reservation{Token: fmt.Sprint("x", i), Namespace: "other"}, vmipamv1.IPv6); err != nil {
						t.Fatal(err)
					}
				}
			}
			v4Before, _ := pool.FamilySnapshot(vmipamv1.IPv4)
			d := &Assigner{Registry: reg, Kind: kinds.VirtualMachine}
			obj := vmJSON(t, nil, tc.spec)
			resp := d.Handle(t.Context(), vmRequest(admissionv1.Create, obj))
			if tc.code != 0 {
				if resp.Allowed || resp.Result == nil || resp.Result.Code != tc.code || !strings.Contains(resp.Result.Message, tc.message) {
					t.Fatalf("allowed %v, %+v; want %d saying %q", resp.Allowed, resp.Result, tc.code, tc.message)
				}
				if after, _ := pool.FamilySnapshot(vmipamv1.IPv4); after.Pending != v4Before.Pending {
					t.Errorf("IPv4 pending %d -> %d: a refused create must leave no reservation", v4Before.Pending, after.Pending)
				}
				return
			}
			if !resp.Allowed {
				t.Fatalf("refused: %+v", resp.Result)
			}
			o := applied(t, obj, resp)
			spec := o["spec"].(map[string]any)
			addrs, _ := spec["addresses"].([]any)
			if len(addrs) != len(tc.want) {
				t.Fatalf("spec.addresses %v, want %d addresses (%v)", addrs, len(tc.want), tc.want)
			}
			var stamped []string
			for i, a := range addrs {
				x := netip.MustParseAddr(a.(string))
				if fam := string(pools.FamilyOf(x)); fam != tc.want[i] {
					t.Errorf("address %d is %s, an %s one; want %s", i, x, fam, tc.want[i])
				}
				if i < len(tc.statics) && a != tc.statics[i] {
					t.Errorf("address %d is %s, want the static %s", i, a, tc.statics[i])
				}
				stamped = append(stamped, a.(string))
			}
			ann := annotations(o)
			if ann[vmipamv1.AddressAnnotation] != strings.Join(stamped, ",") {
				t.Errorf("address annotation %q, want %q", ann[vmipamv1.AddressAnnotation], strings.Join(stamped, ","))
			}
			tok, _ := ann[vmipamv1.TokenAnnotation].(string)
			for _, a := range stamped {
				if st, ow, _ := pool.Lookup(netip.MustParseAddr(a)); st != ipam.StatePending || ow.Token != tok {
					t.Errorf("%s is %s for %q, want pending for the stamped token %q", a, st, ow.Token, tok)
				}
			}
			raw, _ := json.Marshal(spec["network"])
			var n vmipamv1.Network
			_ = json.Unmarshal(raw, &n)
			if len(n.Addresses) != len(stamped) {
				t.Errorf("spec.network %s, want an entry per address", raw)
			}
			if _, ok := ann[vmipamv1.SingleStackAnnotation]; ok != tc.note || tc.note && len(resp.Warnings) == 0 {
				t.Errorf("annotation %s present: %v, warnings %v; want a note: %v", vmipamv1.SingleStackAnnotation, ok, resp.Warnings, tc.note)
			}
		})
	}
}

// TestDualStackProperties drives the mutating webhook over a small pool of
// both families with random creates (every family policy and order, static
// requests of either family or both, taken or not) and deletes, binding
// each allowed create's addresses as the controller would, and checks
// after every step: no address on two live VMs, in either family; a VM
// holds what its policy allows (RequireDualStack both families, never one);
// a refused create leaves every count as it was (no reservation of either
// family kept); and, once every VM is gone, nothing is pending, allocated
// or cooling down (the pool's cooldown is 0s): nothing leaked.
func TestDualStackProperties(t *testing.T) {
	policies := []string{"", "SingleStack", "PreferDualStack", "RequireDualStack"}
	orders := [][]any{nil, {"IPv4"}, {"IPv6"}, {"IPv4", "IPv6"}, {"IPv6", "IPv4"}}
	for seed := range uint64(8) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7)) //nolint:gosec // reproducible test randomness
			reg, _, _ := newTestRegistry(t, "10.0.0.0/29", func(p *vmipamv1.IPPool) {
				p.Name = "dual"
				p.Spec.Ranges = append(p.Spec.Ranges, vmipamv1.IPRange{CIDR: "fd00::/126"})
				p.Spec.Cooldown = &metav1.Duration{}
			})
			pool := reg.Get("dual")
			d := &Assigner{Registry: reg, Kind: kinds.VirtualMachine}
			type vm struct {
				uid   string
				addrs []netip.Addr
			}
			var live []vm
			holder := map[netip.Addr]string{}
			usable := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6", "fd00::1", "fd00::2", "fd00::3"}
			for step := range 300 {
				if len(live) > 0 && rng.IntN(3) == 0 {
					i := rng.IntN(len(live))
					x := live[i]
					for _, a := range x.addrs {
						if err := pool.Release(t.Context(), a, ipam.Owner{UID: x.uid}); err != nil {
							t.Fatalf("step %d: release %s of %s: %v", step, a, x.uid, err)
						}
						delete(holder, a)
					}
					live = append(live[:i], live[i+1:]...)
					continue
				}
				spec := map[string]any{}
				policy := policies[rng.IntN(len(policies))]
				if policy != "" {
					spec["ipFamilyPolicy"] = policy
				}
				if o := orders[rng.IntN(len(orders))]; o != nil {
					spec["ipFamilies"] = o
				}
				switch rng.IntN(4) {
				case 0:
					spec["addresses"] = []any{usable[rng.IntN(len(usable))]}
				case 1:
					spec["addresses"] = []any{usable[rng.IntN(6)], usable[6+rng.IntN(3)]}
				}
				before := pool.Snapshot()
				obj := vmJSON(t, nil, spec)
				resp := d.Handle(t.Context(), vmRequest(admissionv1.Create, obj))
				if !resp.Allowed {
					if after := pool.Snapshot(); after.Pending != before.Pending || after.Allocated != before.Allocated {
						t.Fatalf("step %d: %v refused (%s), yet the pool went from %+v to %+v", step, spec, resp.Result.Message, before, after)
					}
					continue
				}
				o := applied(t, obj, resp)
				raw, _ := o["spec"].(map[string]any)["addresses"].([]any)
				tok, _ := annotations(o)[vmipamv1.TokenAnnotation].(string)
				x := vm{uid: fmt.Sprint("uid-", step)}
				for _, s := range raw {
					a := netip.MustParseAddr(s.(string))
					if other, dup := holder[a]; dup {
						t.Fatalf("step %d: DUPLICATE: %s given to %s while %s holds it", step, a, x.uid, other)
					}
					if got, err := pool.Bind(a, ipam.Owner{Token: tok, UID: x.uid}); err != nil || got != a {
						t.Fatalf("step %d: bind %s: %s, %v", step, a, got, err)
					}
					holder[a] = x.uid
					x.addrs = append(x.addrs, a)
				}
				switch {
				case policy == "RequireDualStack" && (len(x.addrs) != 2 || x.addrs[0].Is4() == x.addrs[1].Is4()):
					t.Fatalf("step %d: RequireDualStack got %v", step, x.addrs)
				case (policy == "" || policy == "SingleStack") && len(x.addrs) != 1:
					t.Fatalf("step %d: SingleStack got %v", step, x.addrs)
				case len(x.addrs) == 0 || len(x.addrs) > 2:
					t.Fatalf("step %d: %s got %v", step, policy, x.addrs)
				}
				if after := pool.Snapshot(); after.Pending != before.Pending {
					t.Fatalf("step %d: %d pending after binding the create, %d before", step, after.Pending, before.Pending)
				}
				live = append(live, x)
			}
			for _, x := range live {
				for _, a := range x.addrs {
					if err := pool.Release(t.Context(), a, ipam.Owner{UID: x.uid}); err != nil {
						t.Fatal(err)
					}
				}
			}
			if c := pool.Snapshot(); c.Pending != 0 || c.Allocated != 0 || c.Cooldown != 0 {
				t.Errorf("every VM gone, yet %+v: leaked", c)
			}
		})
	}
}
