package rawwatch

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	clientfeatures "k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/pools"
	"github.com/vmipam/vmipam/test/harness"
)

var (
	k8s client.Client
	cfg *rest.Config
)

// TestMain starts a kube-apiserver and etcd with vmipam's CRDs; under
// -short only the tests of the stream decoder run.
func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, func() (func(bool) error, error) {
		env, err := harness.StartEnv(harness.EnvOptions{CRDs: []string{filepath.Join("..", "..", "deploy", "crd")}})
		if err != nil {
			return nil, err
		}
		k8s, cfg = env.Client, env.Config
		return func(bool) error { return env.Stop() }, nil
	}))
}

var vm = kinds.VirtualMachine

// newVM is a VirtualMachine with a field and an annotation vmipam does not
// read, and a pool it does; holder, if set, is its holder label.
func newVM(ns, name, holder string) *unstructured.Unstructured {
	u := vm.New()
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetAnnotations(map[string]string{"example.com/note": "not read", vmipamv1.PoolAnnotation: "p"})
	if holder != "" {
		u.SetLabels(map[string]string{vmipamv1.HolderLabel: holder, "app": "db"})
	}
	_ = unstructured.SetNestedField(u.Object, int64(2), "spec", "cpus")
	_ = unstructured.SetNestedField(u.Object, "p", "spec", "ipPool")
	return u
}

// setup makes namespace ns with unlabelled VMs u-0..u-(n-1) and labelled
// VMs l-0..l-2, and returns a ListWatch of the unlabelled ones there.
func setup(t *testing.T, ns string, n int) *ListWatch {
	t.Helper()
	harness.NeedControlPlane(t)
	ctx := t.Context()
	if err := k8s.Create(ctx, &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}}}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := k8s.Create(ctx, newVM(ns, fmt.Sprintf("u-%d", i), "")); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		if err := k8s.Create(ctx, newVM(ns, fmt.Sprintf("l-%d", i), "r0")); err != nil {
			t.Fatal(err)
		}
	}
	return unlabelledVMs(t, cfg)
}

// unlabelledVMs is a ListWatch through c of the VMs without a holder
// label, as a replica watches them.
func unlabelledVMs(t *testing.T, c *rest.Config) *ListWatch {
	t.Helper()
	sel, err := pools.Unlabelled()
	if err != nil {
		t.Fatal(err)
	}
	lw, err := New(c, nil, vm.GVR(), sel, vm.DecodeTrimmed)
	if err != nil {
		t.Fatal(err)
	}
	return lw
}

// checkTrimmed fails unless u is VM ns/name as DecodeTrimmed keeps it: the
// pool kept, the unread field and annotation dropped.
func checkTrimmed(t *testing.T, u *unstructured.Unstructured, ns string) {
	t.Helper()
	if u.GetNamespace() != ns || u.GetUID() == "" || u.GetResourceVersion() == "" || u.GetKind() != "VirtualMachine" {
		t.Errorf("object %s/%s (uid %q, rv %q, kind %q) lacks its identity", u.GetNamespace(), u.GetName(), u.GetUID(), u.GetResourceVersion(), u.GetKind())
	}
	if p, _, _ := unstructured.NestedString(u.Object, "spec", "ipPool"); p != "p" {
		t.Errorf("%s: spec.ipPool %q, want p", u.GetName(), p)
	}
	if _, found, _ := unstructured.NestedFieldNoCopy(u.Object, "spec", "cpus"); found {
		t.Errorf("%s: spec.cpus kept; vmipam does not read it", u.GetName())
	}
	if a := u.GetAnnotations(); a["example.com/note"] != "" || a[vmipamv1.PoolAnnotation] != "p" {
		t.Errorf("%s: annotations %v, want only %s", u.GetName(), a, vmipamv1.PoolAnnotation)
	}
}

// TestListPages lists the unlabelled VMs three at a time, as the
// reflector pages a list, and gets each once, trimmed.
func TestListPages(t *testing.T) {
	lw := setup(t, "list", 7)
	seen := map[string]int{}
	opts := metav1.ListOptions{Limit: 3}
	var rv string
	for pages := 1; ; pages++ {
		obj, err := lw.ListWithContext(t.Context(), opts)
		if err != nil {
			t.Fatal(err)
		}
		list := obj.(*unstructured.UnstructuredList)
		for i := range list.Items {
			if list.Items[i].GetNamespace() == "list" {
				checkTrimmed(t, &list.Items[i], "list")
				seen[list.Items[i].GetName()]++
			}
		}
		rv = list.GetResourceVersion()
		if opts.Continue = list.GetContinue(); opts.Continue == "" {
			if pages < 3 {
				t.Errorf("%d pages of at most 3, want at least 3", pages)
			}
			break
		}
	}
	if len(seen) != 7 || rv == "" {
		t.Errorf("listed %v at resourceVersion %q, want u-0..u-6 once each", seen, rv)
	}
	for name, n := range seen {
		if n != 1 || !strings.HasPrefix(name, "u-") {
			t.Errorf("%s listed %d times", name, n)
		}
	}
}

// TestWatchEvents watches from a list's resourceVersion: a create, an
// update, a VM that gains a holder label (gone from the selection) and a
// deletion each arrive with their type, trimmed.
func TestWatchEvents(t *testing.T) {
	ctx := t.Context()
	lw := setup(t, "watch", 2)
	obj, err := lw.ListWithContext(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := lw.WatchWithContext(ctx, metav1.ListOptions{ResourceVersion: obj.(*unstructured.UnstructuredList).GetResourceVersion()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if err := k8s.Create(ctx, newVM("watch", "new", "")); err != nil {
		t.Fatal(err)
	}
	u := newVM("watch", "u-0", "")
	if err := k8s.Patch(ctx, u, client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"ipPool":"p"},"metadata":{"annotations":{"example.com/note":"changed"}}}`))); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Patch(ctx, u, client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"labels":{"`+vmipamv1.HolderLabel+`":"r0"}}}`))); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Delete(ctx, newVM("watch", "u-1", "")); err != nil {
		t.Fatal(err)
	}
	want := []string{"ADDED new", "MODIFIED u-0", "DELETED u-0", "DELETED u-1"}
	var got []string
	timeout := time.After(30 * time.Second)
	for len(got) < len(want) {
		select {
		case e, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch ended after %v", got)
			}
			u, ok := e.Object.(*unstructured.Unstructured)
			if !ok {
				t.Fatalf("event %s of %T: %v", e.Type, e.Object, e.Object)
			}
			if u.GetNamespace() != "watch" {
				continue
			}
			checkTrimmed(t, u, "watch")
			got = append(got, fmt.Sprintf("%s %s", e.Type, u.GetName()))
		case <-timeout:
			t.Fatalf("events %v, want %v", got, want)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("events %v, want %v", got, want)
	}
}

// TestInformer runs client-go's informer on the ListWatch, with its
// streaming list (the WatchListClient feature, on by default) and with a
// list then a watch (the feature off, or an API server without it): its
// store holds the unlabelled VMs, trimmed, and follows a create.
func TestInformer(t *testing.T) {
	for name, streaming := range map[string]bool{"streaming-list": true, "list-then-watch": false} {
		t.Run(name, func(t *testing.T) {
			clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, streaming)
			ctx := t.Context()
			ns := "informer-" + name
			setup(t, ns, 4)
			// The same ListWatch as setup's, through a transport that
			// tells whether the reflector streamed its list.
			var streamed atomic.Bool
			rc := rest.CopyConfig(cfg)
			rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
				return roundTripper(func(r *http.Request) (*http.Response, error) {
					if r.URL.Query().Get("sendInitialEvents") == "true" {
						streamed.Store(true)
					}
					return rt.RoundTrip(r)
				})
			})
			inf := toolscache.NewSharedIndexInformer(unlabelledVMs(t, rc), vm.New(), 0, toolscache.Indexers{toolscache.NamespaceIndex: toolscache.MetaNamespaceIndexFunc})
			go inf.RunWithContext(ctx)
			if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
				t.Fatal("the informer did not sync")
			}
			if streamed.Load() != streaming {
				t.Errorf("the reflector streamed its list: %t, want %t", streamed.Load(), streaming)
			}
			if err := k8s.Create(ctx, newVM(ns, "late", "")); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				objs, err := inf.GetIndexer().ByIndex(toolscache.NamespaceIndex, ns)
				if err != nil {
					t.Fatal(err)
				}
				if len(objs) == 5 {
					for _, o := range objs {
						u := o.(*unstructured.Unstructured)
						checkTrimmed(t, u, ns)
						if strings.HasPrefix(u.GetName(), "l-") {
							t.Errorf("%s is labelled and not selected", u.GetName())
						}
					}
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("the store holds %d VMs of namespace %s, want u-0..u-3 and late", len(objs), ns)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

// TestDecodeStream reads a watch stream as the API server writes it, and
// one it would not: every event type, an ERROR's Status, then what fails.
func TestDecodeStream(t *testing.T) {
	stream := `{"type":"ADDED","object":{"apiVersion":"vmipam.io/v1alpha1","kind":"VirtualMachine","metadata":{"name":"a","namespace":"n","resourceVersion":"5","annotations":{"example.com/note":"x"}},"spec":{"cpus":2,"ipPool":"p"}}}
{"type":"BOOKMARK","object":{"apiVersion":"vmipam.io/v1alpha1","kind":"VirtualMachine","metadata":{"resourceVersion":"6","annotations":{"k8s.io/initial-events-end":"true"}}}}
  {"object":{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too old resource version: 1 (6)","reason":"Expired","code":410},"type":"ERROR"}
{"type":"SURPRISE","object":{}}
`
	d := &eventDecoder{body: io.NopCloser(strings.NewReader(stream)), decode: vm.DecodeTrimmed}
	d.frames = newFrames(d.body)
	typ, obj, err := d.Decode()
	if u, ok := obj.(*unstructured.Unstructured); err != nil || typ != watch.Added || !ok || u.GetName() != "a" || len(u.GetAnnotations()) != 0 || u.Object["spec"].(map[string]any)["cpus"] != nil {
		t.Errorf("first event: %s %#v %v; want ADDED a, trimmed", typ, obj, err)
	}
	typ, obj, err = d.Decode()
	if u, ok := obj.(*unstructured.Unstructured); err != nil || typ != watch.Bookmark || !ok || u.GetResourceVersion() != "6" || u.GetAnnotations()[metav1.InitialEventsAnnotationKey] != "true" {
		t.Errorf("bookmark: %s %#v %v; want its resourceVersion and annotation", typ, obj, err)
	}
	typ, obj, err = d.Decode()
	if err != nil || typ != watch.Error || !apierrors.IsResourceExpired(apierrors.FromObject(obj)) {
		t.Errorf("error event: %s %#v %v; want an Expired Status", typ, obj, err)
	}
	if typ, _, err = d.Decode(); err == nil || !strings.Contains(err.Error(), "SURPRISE") {
		t.Errorf("unknown event: %s %v; want an error naming it", typ, err)
	}
	if _, _, err = d.Decode(); !errors.Is(err, io.EOF) {
		t.Errorf("end of stream: %v, want EOF", err)
	}
}

// TestListOfBuiltInKind lists a core kind from a stand-in API server that
// answers as the real one does for a built-in kind's list: items without
// their type, which the list's gives them, as the dynamic client would.
func TestListOfBuiltInKind(t *testing.T) {
	var asked string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked = r.URL.Path + "?" + r.URL.Query().Get("labelSelector")
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9","continue":"c"},
			"items":[{"metadata":{"name":"a","namespace":"n","annotations":{"other":"x"}}},{"apiVersion":"v1","kind":"Pod","metadata":{"name":"b","namespace":"n"}}]}`)
	}))
	defer srv.Close()
	pod := kinds.Kind{GVK: schema.GroupVersionKind{Version: "v1", Kind: "Pod"}, Resource: "pods"}
	sel, err := pools.Unlabelled()
	if err != nil {
		t.Fatal(err)
	}
	lw, err := New(&rest.Config{Host: srv.URL}, nil, pod.GVR(), sel, pod.DecodeTrimmed)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := lw.List(metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := "/api/v1/pods?!" + vmipamv1.HolderLabel; asked != want {
		t.Errorf("asked %s, want %s", asked, want)
	}
	list := obj.(*unstructured.UnstructuredList)
	if list.GetResourceVersion() != "9" || list.GetContinue() != "c" || len(list.Items) != 2 {
		t.Fatalf("list %v with %d items, want resourceVersion 9, continue c, 2 items", list.Object, len(list.Items))
	}
	for _, u := range list.Items {
		if u.GroupVersionKind() != pod.GVK || u.GetNamespace() != "n" || len(u.GetAnnotations()) != 0 {
			t.Errorf("item %s: %v, want a trimmed v1 Pod", u.GetName(), u.Object)
		}
	}
}

// roundTripper is a function as an http.RoundTripper.
type roundTripper func(*http.Request) (*http.Response, error)

// RoundTrip implements http.RoundTripper.
func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
