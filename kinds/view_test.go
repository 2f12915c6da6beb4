package kinds

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	jsonpatchapply "github.com/evanphx/json-patch/v5"
	"gomodules.xyz/jsonpatch/v2"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/test/fixture"
)

// byAnnotation is a kind that keeps its address in an annotation.
var byAnnotation = Kind{
	GVK: schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Box"}, Resource: "boxes",
	AddressAnnotation: "example.com/ip", NetworkField: []string{"spec", "net"},
}

// deep is a kind whose address field lies three objects down.
var deep = Kind{
	GVK: schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Deep"}, Resource: "deeps",
	AddressesField: []string{"spec", "network", "addresses"}, PoolField: []string{"spec", "network", "pool"},
	NetworkField: []string{"spec", "network", "identity"},
}

// oneString is a kind whose address is a string field.
var oneString = Kind{
	GVK: schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "One"}, Resource: "ones",
	AddressField: []string{"spec", "net", "ip"}, PoolAnnotation: "example.com/pool",
}

// jsonOnMetadata keeps its address as a JSON list in its own annotation.
var jsonOnMetadata = Kind{
	GVK: schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Calico"}, Resource: "calicos",
	AddressAnnotation: "cni.projectcalico.org/ipAddrs", AnnotationFormat: FormatJSON,
	NetworkAnnotation: "example.com/network",
}

// readBack is the addresses a stamped object carries where its kind keeps
// them.
func readBack(tg Kind, v *View) []string {
	if tg.Status != nil {
		return StampedAddresses(v.StampedAddress)
	}
	return v.Addresses
}

// stampAddrs is what the tests stamp on an object of tg: an address of
// each family where its location holds two, else one.
func stampAddrs(tg Kind) []string {
	if tg.MaxAddresses() == 2 {
		return []string{"10.0.0.5", "fd00::5"}
	}
	return []string{"10.0.0.5"}
}

// testNetwork is the network identity the tests stamp.
var testNetwork = &vmipamv1.Network{
	Addresses: []string{"10.0.0.5/24"}, Gateways: []string{"10.0.0.1"},
	Routes: []vmipamv1.Route{{Destination: "10.200.0.0/16", Via: "10.0.0.1"}},
}

// networkOf reads the network identity where tg writes it on obj; nil
// when there is none.
func networkOf(t *testing.T, tg Kind, obj map[string]any) *vmipamv1.Network {
	t.Helper()
	loc, ann := tg.networkLocation()
	if loc == nil {
		return nil
	}
	var cur any = obj
	for _, k := range loc {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		if cur, ok = m[k]; !ok {
			return nil
		}
	}
	raw, _ := json.Marshal(cur)
	if ann {
		s, _ := cur.(string)
		raw = []byte(s)
	}
	n := &vmipamv1.Network{}
	if err := json.Unmarshal(raw, n); err != nil {
		t.Fatalf("the network at %s does not decode: %v", tg.NetworkPath(), err)
	}
	return n
}

func apply(t *testing.T, obj []byte, ops []jsonpatch.Operation, errs ...error) map[string]any {
	t.Helper()
	if len(errs) > 0 && errs[0] != nil {
		t.Fatal(errs[0])
	}
	return fixture.Patched(t, obj, ops)
}

func TestReadAndStamp(t *testing.T) {
	tests := map[string]struct {
		kind Kind
		obj  string
		// want is the stamped object's address, pool and token as read
		// back by Read.
		wantErr string
	}{
		"empty spec":                  {kind: VirtualMachine, obj: `{"apiVersion":"vmipam.io/v1alpha1","kind":"VirtualMachine","metadata":{"name":"a"},"spec":{}}`},
		"no spec":                     {kind: VirtualMachine, obj: `{"apiVersion":"vmipam.io/v1alpha1","kind":"VirtualMachine","metadata":{"name":"a"}}`},
		"null spec, null lists":       {kind: VirtualMachine, obj: `{"metadata":{"annotations":null,"finalizers":null},"spec":null}`},
		"no metadata":                 {kind: VirtualMachine, obj: `{"spec":{"ipPool":"p"}}`},
		"other annotations":           {kind: VirtualMachine, obj: `{"metadata":{"annotations":{"a/b":"c","vmipam.io/pool":"old"},"finalizers":["x"]}}`},
		"our finalizer already":       {kind: VirtualMachine, obj: `{"metadata":{"finalizers":["vmipam.io/release-address"]}}`},
		"escaped key":                 {kind: VirtualMachine, obj: `{"metadata":{"annotations":{"vmipam.io\/token":"copied"}}}`},
		"other labels":                {kind: VirtualMachine, obj: `{"metadata":{"labels":{"app":"db"}}}`},
		"null labels":                 {kind: VirtualMachine, obj: `{"metadata":{"labels":null}}`},
		"another holder":              {kind: VirtualMachine, obj: `{"metadata":{"labels":{"app":"db","vmipam.io/holder":"h2"}}}`},
		"holder not a string":         {kind: VirtualMachine, obj: `{"metadata":{"labels":{"vmipam.io/holder":1}}}`, wantErr: "metadata.labels[vmipam.io/holder]"},
		"deep, nothing":               {kind: deep, obj: `{"metadata":{}}`},
		"deep, half":                  {kind: deep, obj: `{"spec":{"other":1}}`},
		"deep, full":                  {kind: deep, obj: `{"spec":{"network":{"pool":"p","addresses":[]}}}`},
		"annotation":                  {kind: byAnnotation, obj: `{"metadata":{"annotations":{"x":"y"}}}`},
		"string field":                {kind: oneString, obj: `{"metadata":{"annotations":{"example.com/pool":"p"}},"spec":{"net":{"ip":""}}}`},
		"string field, absent":        {kind: oneString, obj: `{"spec":{}}`},
		"string field, number":        {kind: oneString, obj: `{"spec":{"net":{"ip":5}}}`, wantErr: "spec.net.ip: Invalid value"},
		"json on metadata":            {kind: jsonOnMetadata, obj: `{"metadata":{"annotations":{"cni.projectcalico.org/ipAddrs":"[\"10.0.0.5\"]"}}}`},
		"json on metadata, respelled": {kind: jsonOnMetadata, obj: `{"metadata":{"annotations":{"cni.projectcalico.org/ipAddrs":"[ \"10.0.0.5\" ]"}}}`},
		"json, not json":              {kind: jsonOnMetadata, obj: `{"metadata":{"annotations":{"cni.projectcalico.org/ipAddrs":"10.0.0.5"}}}`, wantErr: "must be a JSON list of strings"},
		"template, nothing":           {kind: kubevirtLike, obj: `{"spec":{"running":true}}`},
		"template, no metadata":       {kind: kubevirtLike, obj: `{"spec":{"template":{"spec":{}}}}`},
		"template, other annotation":  {kind: kubevirtLike, obj: `{"spec":{"template":{"metadata":{"annotations":{"a/b":"c"}}}}}`},
		"template, static":            {kind: kubevirtLike, obj: `{"spec":{"template":{"metadata":{"annotations":{"cni.projectcalico.org/ipAddrs":"[\"10.0.0.5\"]"}}}}}`},
		"template not an object":      {kind: kubevirtLike, obj: `{"spec":{"template":[]}}`, wantErr: "spec.template: Invalid value"},
		"status kind":                 {kind: neonLike, obj: `{"spec":{"extraNetwork":{"enable":true}}}`},
		"status kind, filled":         {kind: neonLike, obj: `{"status":{"extraNetIP":"10.0.0.5"}}`},
		"spec not an object":          {kind: VirtualMachine, obj: `{"spec":5}`, wantErr: "spec: Invalid value"},
		"addresses not strings":       {kind: VirtualMachine, obj: `{"spec":{"addresses":[1]}}`, wantErr: "spec.addresses: Invalid value"},
		"too many addresses":          {kind: VirtualMachine, obj: `{"spec":{"addresses":["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"]}}`, wantErr: "more than 16"},
		"name not a string":           {kind: VirtualMachine, obj: `{"metadata":{"name":7}}`, wantErr: "metadata.name: Invalid value"},
		"metadata not object":         {kind: VirtualMachine, obj: `{"metadata":"x"}`, wantErr: "metadata: Invalid value"},
		"finalizers not a list":       {kind: VirtualMachine, obj: `{"metadata":{"finalizers":{}}}`, wantErr: "metadata.finalizers"},
		"token not a string":          {kind: VirtualMachine, obj: `{"metadata":{"annotations":{"vmipam.io/token":1}}}`, wantErr: "vmipam.io/token"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			v, err := tc.kind.Read([]byte(tc.obj))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Read: %v, want an error saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			addrs := stampAddrs(tc.kind)
			ops, err := tc.kind.StampPatch(v, Stamp{Addrs: addrs, Pool: "pool-a", Token: "tok", Holder: "h1", Network: testNetwork})
			stamped := apply(t, []byte(tc.obj), ops, err)
			raw, _ := json.Marshal(stamped)
			back, err := tc.kind.Read(raw)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(readBack(tc.kind, back), addrs) || back.StampedPool != "pool-a" || back.Token != "tok" || !back.HasFinalizer || back.Holder != "h1" {
				t.Fatalf("stamped object reads back as %+v, want the addresses %v", back, addrs)
			}
			if loc, _ := tc.kind.networkLocation(); loc != nil {
				if got := networkOf(t, tc.kind, stamped); !reflect.DeepEqual(got, testNetwork) {
					t.Errorf("the network at %s reads back as %+v, want %+v", tc.kind.NetworkPath(), got, testNetwork)
				}
			}
			// Stamping again, without a network, changes nothing.
			if ops, _ := tc.kind.StampPatch(back, Stamp{Addrs: addrs, Pool: "pool-a", Token: "tok", Holder: "h1"}); len(ops) != 0 {
				t.Errorf("a second stamp patches %v", ops)
			}
			// A dry run stamps the pool and the finalizer, and no token.
			dry := apply(t, []byte(tc.obj), tc.kind.DryRunPatch(v, "pool-a", nil))
			raw, _ = json.Marshal(dry)
			if back, err = tc.kind.Read(raw); err != nil || back.HasToken || back.StampedPool != "pool-a" || !back.HasFinalizer {
				t.Fatalf("dry run reads back as %+v, %v", back, err)
			}
			// Nothing else is lost.
			orig := map[string]any{}
			_ = json.Unmarshal([]byte(tc.obj), &orig)
			if a, ok := nested(orig, "metadata", "annotations", "a/b"); ok {
				if b, _ := nested(stamped, "metadata", "annotations", "a/b"); b != a {
					t.Errorf("lost annotation a/b")
				}
			}
			if a, ok := nested(orig, "metadata", "labels", "app"); ok {
				if b, _ := nested(stamped, "metadata", "labels", "app"); b != a {
					t.Errorf("lost label app")
				}
			}
		})
	}
}

func nested(m map[string]any, path ...string) (any, bool) {
	v, found, err := unstructured.NestedFieldNoCopy(m, path...)
	return v, found && err == nil
}

func TestTrim(t *testing.T) {
	u := &unstructured.Unstructured{}
	big := strings.Repeat("x", 1<<16)
	if err := json.Unmarshal([]byte(`{"apiVersion":"vmipam.io/v1alpha1","kind":"VirtualMachine",
		"metadata":{"name":"a","namespace":"n","uid":"u","resourceVersion":"7","labels":{"l":"`+big+`","vmipam.io/holder":"h1"},
		"annotations":{"vmipam.io/token":"t","vmipam.io/pool":"p","other":"`+big+`"},"finalizers":["f"],
		"managedFields":[{"manager":"`+big+`"}],"deletionTimestamp":"2026-01-01T00:00:00Z"},
		"spec":{"addresses":["10.0.0.1"],"ipPool":"p","ipFamilyPolicy":"RequireDualStack","ipFamilies":["IPv6"],"image":"`+big+`"},"status":{"conditions":[{"type":"`+big+`"}]}}`), &u.Object); err != nil {
		t.Fatal(err)
	}
	out, err := VirtualMachine.Trim(u)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(out)
	if len(got) > 1024 {
		t.Fatalf("trimmed object is %d bytes: %s", len(got), got)
	}
	tr := out.(*unstructured.Unstructured)
	addrs, _ := VirtualMachine.Addresses(tr)
	pool, _ := VirtualMachine.Pool(tr)
	if tr.GetName() != "a" || tr.GetNamespace() != "n" || tr.GetUID() != "u" || tr.GetResourceVersion() != "7" ||
		tr.GetDeletionTimestamp() == nil || !controllerutil.ContainsFinalizer(&unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"finalizers": []any{vmipamv1.Finalizer}}}}, vmipamv1.Finalizer) ||
		len(tr.GetFinalizers()) != 1 || tr.GetAnnotations()[vmipamv1.TokenAnnotation] != "t" || !reflect.DeepEqual(addrs, []string{"10.0.0.1"}) || pool != "p" ||
		tr.GetLabels()[vmipamv1.HolderLabel] != "h1" {
		t.Fatalf("trimmed object lost what vmipam reads: %s", got)
	}
	if policy, _, _ := unstructured.NestedString(tr.Object, "spec", "ipFamilyPolicy"); policy != "RequireDualStack" {
		t.Errorf("trimmed object lost its family policy: %s", got)
	}
	if fams, _, _ := unstructured.NestedStringSlice(tr.Object, "spec", "ipFamilies"); !reflect.DeepEqual(fams, []string{"IPv6"}) {
		t.Errorf("trimmed object lost its families: %s", got)
	}
	if other, _ := VirtualMachine.Trim("a tombstone"); other != "a tombstone" {
		t.Errorf("Trim changed a non-object: %v", other)
	}
}

// FuzzStampPatch: whatever object Read accepts, the stamp patch applies to
// it and reads back as stamped.
func FuzzStampPatch(f *testing.F) {
	for _, s := range []string{`{}`, `{"spec":{}}`, `{"metadata":{"annotations":{"a":"b"},"finalizers":["x"]},"spec":{"addresses":["1.2.3.4"]}}`,
		`{"spec":null}`, `{"metadata":null}`, `{"spec":{"network":{"addresses":null}}}`, `{"metadata":{"annotations":{"vmipam.io/token":"t"}}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, obj []byte) {
		if !json.Valid(obj) {
			return
		}
		var m map[string]any
		if json.Unmarshal(obj, &m) != nil {
			return
		}
		for _, tg := range []Kind{VirtualMachine, deep, byAnnotation, oneString, jsonOnMetadata, kubevirtLike, neonLike} {
			v, err := tg.Read(obj)
			if err != nil {
				continue
			}
			addrs := stampAddrs(tg)
			ops, err := tg.StampPatch(v, Stamp{Addrs: addrs, Pool: "p", Token: "t", Holder: "h", Network: testNetwork})
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := json.Marshal(ops)
			p, err := jsonpatchapply.DecodePatch(raw)
			if err != nil {
				t.Fatalf("%s: patch %s does not decode: %v", tg.GVK.Kind, raw, err)
			}
			out, err := p.Apply(obj)
			if err != nil {
				t.Fatalf("%s: patch %s does not apply to %s: %v", tg.GVK.Kind, raw, obj, err)
			}
			back, err := tg.Read(out)
			if err != nil || !reflect.DeepEqual(readBack(tg, back), addrs) || back.Token != "t" || !back.HasFinalizer || back.Holder != "h" {
				t.Fatalf("%s: %s stamped to %s reads back as %+v, %v", tg.GVK.Kind, obj, out, back, err)
			}
			var m map[string]any
			if err := json.Unmarshal(out, &m); err != nil {
				t.Fatal(err)
			}
			if loc, _ := tg.networkLocation(); loc != nil && !reflect.DeepEqual(networkOf(t, tg, m), testNetwork) {
				t.Fatalf("%s: %s stamped to %s has the network %+v", tg.GVK.Kind, obj, out, networkOf(t, tg, m))
			}
		}
	})
}
