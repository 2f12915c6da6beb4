package kinds

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utiljson "k8s.io/apimachinery/pkg/util/json"
)

// decodeKinds are the kinds DecodeTrimmed is checked against: every
// address location, with and without a condition, a status kind.
var decodeKinds = map[string]Kind{
	"VirtualMachine": VirtualMachine,
	"byAnnotation":   byAnnotation,
	"deep":           deep,
	"oneString":      oneString,
	"jsonOnMetadata": jsonOnMetadata,
	"kubevirtLike":   kubevirtLike,
	"neonLike":       neonLike,
	"withCondition":  withCondition,
}

var withCondition = func() Kind {
	k := VirtualMachine
	k.Condition = "has(object.spec.extraNetwork)"
	k.PoolAnnotation = "example.com/pool"
	return k
}()

// decodeObjects are objects as the API server sends them, and some it
// would not: duplicate and escaped member names, values of the wrong
// type, nulls, numbers whole and not.
var decodeObjects = map[string]string{
	"stamped": `{"apiVersion":"vmipam.io/v1alpha1","kind":"VirtualMachine","metadata":{"name":"db-1","namespace":"team","uid":"u-1","resourceVersion":"42","generation":3,
		"creationTimestamp":"2026-12-06T10:00:00Z","finalizers":["vmipam.io/release"],"labels":{"app":"db","vmipam.io/holder":"vmipam-0"},
		"annotations":{"vmipam.io/address":"10.0.0.7","vmipam.io/token":"t","other":"x","cni.projectcalico.org/ipAddrs":"[\"10.0.0.7\"]"},
		"managedFields":[{"manager":"kubectl","operation":"Update","fieldsV1":{"f:spec":{}}}]},
		"spec":{"addresses":["10.0.0.7"],"ipPool":"p","ipFamilyPolicy":"SingleStack","ipFamilies":["IPv4"],"extraNetwork":{"enable":true},"cpus":2.5,"memory":1073741824,
		"template":{"metadata":{"annotations":{"cni.projectcalico.org/ipAddrs":"[\"10.0.0.8\"]","box.example.com/address":"10.0.0.9"}}},
		"address":"10.0.0.10","deep":{"down":{"address":"10.0.0.11"}}},
		"status":{"extraNetIP":"10.0.0.12","extraNetMask":"255.255.255.0","conditions":[{"type":"Ready","status":"True"}]}}`,
	"unlabelled": `{"apiVersion":"vmipam.io/v1alpha1","kind":"VirtualMachine","metadata":{"name":"plain","namespace":"team","uid":"u-2","resourceVersion":"43"},"spec":{"cpus":1}}`,
	"duplicates": `{"kind":"A","kind":"VirtualMachine","metadata":{"name":"first"},"metadata":{"name":"second","labels":{"vmipam.io/holder":"a","vmipam.io/holder":"b"}},
		"spec":{"addresses":["1.1.1.1"]},"spec":{"addresses":["2.2.2.2"],"ipPool":"q"}}`,
	"escaped": `{"ki\u006ed":"VirtualMachine","met\u0061data":{"n\u0061me":"esc\u00e9","annotations":{"vmipam.io\/address":"10.1.1.1","vmipam.io/tok\u0065n":"\ud83d\ude00"}},"sp\u0065c":{"ip\u0050ool":"\u0070"}}`,
	"wrongTypes": `{"apiVersion":7,"kind":"VirtualMachine","metadata":{"name":1,"namespace":true,"generation":1.5,"finalizers":"x","labels":["vmipam.io/holder"],"annotations":"a"},
		"spec":{"addresses":"10.0.0.1","ipPool":{"name":"p"},"template":[]},"status":"none"}`,
	"nulls":             `{"apiVersion":null,"kind":"VirtualMachine","metadata":{"deletionTimestamp":null,"labels":null,"annotations":null},"spec":null,"status":null}`,
	"metadataNotObject": `{"kind":"VirtualMachine","metadata":"x","spec":{"addresses":[]}}`,
	"noMetadata":        `{"kind":"VirtualMachine","spec":{"ipPool":"p","address":{"nested":[1,2.0,-3e2,1e300,12345678901234567890,-0]}}}`,
	"onlyKind":          `{"kind":"VirtualMachine"}`,
	"whitespace":        " {\n \"kind\" : \"VirtualMachine\" ,\t\"metadata\" : { \"name\" : \"w\" , \"annotations\" : { \"vmipam.io/address\" : \"10.0.0.1\" } } , \"spec\" : { \"addresses\" : [ \"10.0.0.1\" ] } }\n",
}

// trimmedWhole is the oracle: the object decoded whole, as the dynamic
// client decodes a watch event's, then Trim.
func trimmedWhole(tg Kind, data []byte) (*unstructured.Unstructured, error) {
	m := map[string]any{}
	obj, _, err := unstructured.UnstructuredJSONScheme.Decode(data, nil, &unstructured.Unstructured{Object: m})
	if err != nil {
		return nil, err
	}
	out, err := tg.Trim(obj)
	if err != nil {
		return nil, err
	}
	return out.(*unstructured.Unstructured), nil
}

// TestDecodeTrimmed checks that DecodeTrimmed keeps what Trim keeps of
// the object decoded whole, for every kind and object above.
func TestDecodeTrimmed(t *testing.T) {
	for kname, tg := range decodeKinds {
		for oname, data := range decodeObjects {
			t.Run(kname+"/"+oname, func(t *testing.T) {
				checkDecodeTrimmed(t, tg, []byte(data), true)
			})
		}
	}
}

// checkDecodeTrimmed compares DecodeTrimmed with the oracle on data. The
// oracle refuses what is not an object it can decode (no kind, a number
// out of range); the watch never hands those over, and unless must, data
// is then not checked.
func checkDecodeTrimmed(t *testing.T, tg Kind, data []byte, must bool) {
	t.Helper()
	want, werr := trimmedWhole(tg, data)
	if werr != nil {
		if must {
			t.Fatalf("decode %s whole: %v", data, werr)
		}
		return
	}
	got, err := tg.DecodeTrimmed(data)
	if err != nil {
		t.Fatalf("DecodeTrimmed(%s): %v; decoded whole and trimmed it is %v", data, err, want.Object)
	}
	if !equality.Semantic.DeepEqual(got.Object, want.Object) {
		t.Errorf("DecodeTrimmed(%s):\n got %#v\nwant %#v", data, got.Object, want.Object)
	}
}

// FuzzDecodeTrimmed checks DecodeTrimmed against Trim of the whole object
// on any valid JSON object the oracle decodes (one with a string kind), for
// every kind above.
func FuzzDecodeTrimmed(f *testing.F) {
	for _, data := range decodeObjects {
		f.Add([]byte(data))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !json.Valid(data) {
			// jsonscan's premise: the watch's framing checks each event.
			return
		}
		for _, tg := range decodeKinds {
			checkDecodeTrimmed(t, tg, data, false)
		}
	})
}

// BenchmarkDecodeTrimmed compares what a replica pays per watch event of
// an object it does not look after: the dynamic client's decoding (the
// event's object decoded whole into unstructured) and Trim, against
// DecodeTrimmed.
func BenchmarkDecodeTrimmed(b *testing.B) {
	for _, size := range []int{0, 20} {
		data := []byte(largeVM(size))
		b.Run(fmt.Sprintf("annotations=%d/whole+Trim", size), func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				obj, _, err := unstructured.UnstructuredJSONScheme.Decode(data, nil, nil)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := VirtualMachine.Trim(obj.(runtime.Unstructured)); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("annotations=%d/DecodeTrimmed", size), func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := VirtualMachine.DecodeTrimmed(data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// largeVM is a VirtualMachine as a user's fleet holds them: a spec of a
// few dozen fields, managedFields, a status with conditions, and n more
// annotations.
func largeVM(n int) string {
	var ann strings.Builder
	for i := range n {
		fmt.Fprintf(&ann, `,"example.com/note-%d":"some value of a user's annotation %d"`, i, i)
	}
	return `{"apiVersion":"vmipam.io/v1alpha1","kind":"VirtualMachine","metadata":{"name":"db-12345","namespace":"team-a","uid":"0a1b2c3d-4e5f-6789-abcd-ef0123456789",
"resourceVersion":"123456789","generation":1,"creationTimestamp":"2026-12-06T10:00:00Z","labels":{"app":"postgres","tier":"db","team":"a"},
"annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{\"apiVersion\":\"vmipam.io/v1alpha1\",\"kind\":\"VirtualMachine\"}"` + ann.String() + `},
"managedFields":[{"manager":"kubectl-client-side-apply","operation":"Update","apiVersion":"vmipam.io/v1alpha1","time":"2026-12-06T10:00:00Z","fieldsType":"FieldsV1",
"fieldsV1":{"f:metadata":{"f:labels":{".":{},"f:app":{},"f:team":{},"f:tier":{}}},"f:spec":{".":{},"f:cpus":{},"f:memory":{},"f:image":{},"f:disks":{}}}}]},
"spec":{"cpus":4,"memory":"8Gi","image":"registry.example.com/postgres:16","disks":[{"name":"root","size":"20Gi","storageClass":"fast"},{"name":"data","size":"100Gi","storageClass":"fast"}],
"network":{"name":"default"},"restartPolicy":"Always","nodeSelector":{"kubernetes.io/arch":"amd64"}},
"status":{"phase":"Running","node":"node-7","conditions":[{"type":"Ready","status":"True","lastTransitionTime":"2026-12-06T10:00:05Z"},{"type":"Scheduled","status":"True","lastTransitionTime":"2026-12-06T10:00:01Z"}]}}`
}

// TestDecodeValue checks decodeValue's shortcuts (integers, arrays of
// strings) and what they leave to utiljson against utiljson itself.
func TestDecodeValue(t *testing.T) {
	for _, raw := range []string{`0`, `-0`, `7`, `-42`, `123456789012345678`, `-123456789012345678`, `1234567890123456789`,
		`9223372036854775807`, `9223372036854775808`, `1.5`, `1e3`, `-2E-2`, `[]`, `["a"]`, `["a","b\"c","\u00e9"]`, `["a",1]`,
		`[null]`, `[["a"]]`, `"s"`, `true`, `null`, `{"a":[1]}`} {
		t.Run(raw, func(t *testing.T) {
			var want any
			if err := utiljson.Unmarshal([]byte(raw), &want); err != nil {
				t.Fatal(err)
			}
			got, err := decodeValue([]byte(raw))
			if err != nil || !equality.Semantic.DeepEqual(got, want) || fmt.Sprintf("%T", got) != fmt.Sprintf("%T", want) {
				t.Errorf("decodeValue(%s) = %#v, %v; want %#v", raw, got, err, want)
			}
		})
	}
}
