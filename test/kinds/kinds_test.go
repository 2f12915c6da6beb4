// Package kinds proves the kinds configuration on a real kube-apiserver and
// etcd, with the vmipam binary: three kinds side by side (vmipam's own
// VirtualMachine, a NeonVM-shaped kind whose address goes into status, a
// KubeVirt-shaped kind whose address goes into a JSON-list annotation of
// its template), configured from deploy/kinds and wired by what
// `vmipam manifests` renders. For each: concurrent creates with distinct
// addresses, a static request, release on delete into cooldown, an update
// of the address refused by the API server while vmipam is stopped, and a
// restart.
package kinds

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	kinds1 "github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/test/fixture"
	"github.com/vmipam/vmipam/test/harness"
)

var root = filepath.Join("..", "..")

// kind is one configured kind under test: how to make an object of it, ask
// for an address, and read the address its consumer reads.
type kind struct {
	name string
	gvk  schema.GroupVersionKind
	// make returns an object in scope, asking for static when set.
	make func(ns, name string, static string) *unstructured.Unstructured
	// address is what the VM's consumer reads: spec.addresses[0], NeonVM's
	// status.extraNetIP, the template annotation's one address.
	address func(obj *unstructured.Unstructured) string
	// set moves obj's address to addr in place; update writes it, as a
	// user's update would (of the status, for NeonVM).
	set func(obj *unstructured.Unstructured, addr string)
	// network reads the network identity vmipam wrote beside the address
	// (nil for a kind that takes none).
	network func(obj *unstructured.Unstructured) *vmipamv1.Network
	update  func(ctx context.Context, c client.Client, obj *unstructured.Unstructured) error
	// refusal is in the message refusing the change.
	refusal string
}

func object(gvk schema.GroupVersionKind, ns, name string, content map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: content}
	u.SetGroupVersionKind(gvk)
	u.SetNamespace(ns)
	u.SetName(name)
	return u
}

func str(obj *unstructured.Unstructured, path ...string) string {
	s, _, _ := unstructured.NestedString(obj.Object, path...)
	return s
}

var kinds = []kind{
	{
		name: "vmipam",
		gvk:  vmipamv1.GroupVersion.WithKind("VirtualMachine"),
		make: func(ns, name, static string) *unstructured.Unstructured {
			spec := map[string]any{"image": "debian"}
			if static != "" {
				spec["addresses"] = []any{static}
			}
			return object(vmipamv1.GroupVersion.WithKind("VirtualMachine"), ns, name, map[string]any{"spec": spec})
		},
		address: func(obj *unstructured.Unstructured) string {
			a, _, _ := unstructured.NestedStringSlice(obj.Object, "spec", "addresses")
			if len(a) != 1 {
				return ""
			}
			return a[0]
		},
		set: func(obj *unstructured.Unstructured, addr string) {
			_ = unstructured.SetNestedStringSlice(obj.Object, []string{addr}, "spec", "addresses")
		},
		network: func(obj *unstructured.Unstructured) *vmipamv1.Network {
			m, _, _ := unstructured.NestedMap(obj.Object, "spec", "network")
			raw, _ := json.Marshal(m)
			return decodeNetwork(string(raw))
		},
		update: func(ctx context.Context, c client.Client, obj *unstructured.Unstructured) error {
			return c.Update(ctx, obj)
		},
		refusal: "spec.addresses is immutable once assigned",
	},
	{
		name: "neonvm",
		gvk:  schema.GroupVersionKind{Group: "vm.neon.tech", Version: "v1", Kind: "VirtualMachine"},
		make: func(ns, name, static string) *unstructured.Unstructured {
			u := object(schema.GroupVersionKind{Group: "vm.neon.tech", Version: "v1", Kind: "VirtualMachine"}, ns, name, map[string]any{
				"spec": map[string]any{"guest": map[string]any{"cpus": map[string]any{"min": int64(1)}}, "extraNetwork": map[string]any{"enable": true}},
			})
			if static != "" {
				u.SetAnnotations(map[string]string{kinds1.DefaultRequestAnnotation: static})
			}
			return u
		},
		address: func(obj *unstructured.Unstructured) string { return str(obj, "status", "extraNetIP") },
		set: func(obj *unstructured.Unstructured, addr string) {
			_ = unstructured.SetNestedField(obj.Object, addr, "status", "extraNetIP")
		},
		update: func(ctx context.Context, c client.Client, obj *unstructured.Unstructured) error {
			return c.Status().Update(ctx, obj)
		},
		refusal: "status.extraNetIP is immutable once set",
	},
	{
		name: "kubevirt",
		gvk:  schema.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "VirtualMachine"},
		make: func(ns, name, static string) *unstructured.Unstructured {
			meta := map[string]any{"labels": map[string]any{"kubevirt.io/vm": name}}
			if static != "" {
				meta["annotations"] = map[string]any{"cni.projectcalico.org/ipAddrs": `[ "` + static + `" ]`}
			}
			return object(schema.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "VirtualMachine"}, ns, name, map[string]any{
				"spec": map[string]any{"runStrategy": "Always", "template": map[string]any{"metadata": meta, "spec": map[string]any{"domain": map[string]any{}}}},
			})
		},
		address: func(obj *unstructured.Unstructured) string {
			s := str(obj, "spec", "template", "metadata", "annotations", "cni.projectcalico.org/ipAddrs")
			if !strings.HasPrefix(s, `["`) || !strings.HasSuffix(s, `"]`) || strings.Contains(s, ",") {
				return ""
			}
			return strings.TrimSuffix(strings.TrimPrefix(s, `["`), `"]`)
		},
		set: func(obj *unstructured.Unstructured, addr string) {
			_ = unstructured.SetNestedField(obj.Object, `["`+addr+`"]`, "spec", "template", "metadata", "annotations", "cni.projectcalico.org/ipAddrs")
		},
		network: func(obj *unstructured.Unstructured) *vmipamv1.Network {
			return decodeNetwork(str(obj, "spec", "template", "metadata", "annotations", "vmipam.io/network"))
		},
		update: func(ctx context.Context, c client.Client, obj *unstructured.Unstructured) error {
			return c.Update(ctx, obj)
		},
		refusal: "spec.template.metadata.annotations[cni.projectcalico.org/ipAddrs] is immutable once assigned",
	},
}

// decodeNetwork decodes a network identity, nil when there is none.
func decodeNetwork(s string) *vmipamv1.Network {
	n := &vmipamv1.Network{}
	if s == "" || s == "null" || json.Unmarshal([]byte(s), n) != nil {
		return nil
	}
	return n
}

// config writes one kinds configuration holding the kinds of
// deploy/kinds/kinds.yaml and of the NeonVM and KubeVirt examples, as a
// user who serves all three would.
func config(t *testing.T) string {
	t.Helper()
	all := kinds1.Config{APIVersion: kinds1.ConfigAPIVersion, Kind: kinds1.ConfigKind}
	for _, f := range []string{"kinds.yaml", "examples/neonvm.yaml", "examples/kubevirt.yaml"} {
		raw, err := os.ReadFile(filepath.Join(root, "deploy", "kinds", f))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kinds1.Parse(raw); err != nil {
			t.Fatalf("deploy/kinds/%s: %v", f, err)
		}
		var c kinds1.Config
		if err := yaml.Unmarshal(raw, &c); err != nil {
			t.Fatal(err)
		}
		all.Kinds = append(all.Kinds, c.Kinds...)
	}
	raw, err := yaml.Marshal(all)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kinds.yaml")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// vms is every address handed out, by object, across the kinds: no two
// live objects may share one.
type vms struct {
	mu   sync.Mutex
	byIP map[string]string
}

func (v *vms) add(t *testing.T, who, addr string) {
	t.Helper()
	v.mu.Lock()
	defer v.mu.Unlock()
	if other, dup := v.byIP[addr]; dup {
		t.Errorf("%s and %s both hold %s", other, who, addr)
	}
	v.byIP[addr] = who
}

// settled reads obj until its consumer's address is there, and checks it
// is the one vmipam recorded.
func settled(t *testing.T, c client.Client, k kind, obj *unstructured.Unstructured) string {
	t.Helper()
	var addr string
	harness.Eventually(t, 30*time.Second, k.name+" "+obj.GetName()+" to show its address", func() error {
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		addr = k.address(obj)
		if addr == "" {
			return fmt.Errorf("no address yet: %v", obj.Object)
		}
		return nil
	})
	if stamped := obj.GetAnnotations()[vmipamv1.AddressAnnotation]; stamped != addr {
		t.Errorf("%s %s: address %s, but vmipam recorded %s", k.name, obj.GetName(), addr, stamped)
	}
	if _, err := netip.ParseAddr(addr); err != nil {
		t.Errorf("%s %s: %v", k.name, obj.GetName(), err)
	}
	return addr
}

// checkNetwork checks the network identity beside addr on obj, of the
// kinds pool (10.71.0.0/24 with its gateway and route), where kind k
// takes one.
func checkNetwork(t *testing.T, k kind, obj *unstructured.Unstructured, addr string) {
	t.Helper()
	if k.network == nil {
		return
	}
	want := &vmipamv1.Network{Addresses: []string{addr + "/24"}, Gateways: []string{"10.71.0.1"},
		Routes: []vmipamv1.Route{{Destination: "10.200.0.0/16", Via: "10.71.0.1"}}}
	if got := k.network(obj); !reflect.DeepEqual(got, want) {
		t.Errorf("%s %s: network %+v, want %+v", k.name, obj.GetName(), got, want)
	}
}

// create creates obj, retrying while the pool recovers (503).
func create(ctx context.Context, t *testing.T, c client.Client, obj *unstructured.Unstructured) {
	t.Helper()
	harness.Eventually(t, 30*time.Second, "create "+obj.GetName(), func() error {
		err := c.Create(ctx, obj.DeepCopy())
		if apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) {
			return err
		}
		if err != nil {
			t.Fatalf("create %s: %v", obj.GetName(), err)
		}
		return nil
	})
}

func TestKinds(t *testing.T) {
	harness.NeedControlPlane(t)
	ctx := t.Context()
	cl, err := harness.StartWith(ctx, root, t.TempDir(), harness.ClusterOptions{
		KindsConfig: config(t),
		CRDs:        []string{filepath.Join("testdata")},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Stop() })
	var logs harness.LogBuffer
	start := func() *harness.Process {
		p, err := cl.StartVMIPAM(ctx, &logs)
		if err != nil {
			t.Fatalf("%v\nlogs:\n%s", err, logs.String())
		}
		return p
	}
	p := start()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("vmipam's logs:\n%s", logs.String())
		}
	})
	c := cl.Client
	pool := fixture.Pool("kinds", fixture.WithDefault(), fixture.WithCooldown(time.Hour),
		fixture.WithRanges(vmipamv1.IPRange{CIDR: "10.71.0.0/24", Gateway: "10.71.0.1", Routes: []vmipamv1.Route{{Destination: "10.200.0.0/16"}}}))
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	ns := "kinds"
	if err := c.Create(ctx, object(schema.GroupVersionKind{Version: "v1", Kind: "Namespace"}, "", ns, map[string]any{})); err != nil {
		t.Fatal(err)
	}
	live := &vms{byIP: map[string]string{}}
	// One live object of each kind, kept to the end.
	kept := map[string]*unstructured.Unstructured{}

	for i, k := range kinds {
		t.Run(k.name+"/concurrent creates", func(t *testing.T) {
			const n = 12
			var wg sync.WaitGroup
			objs := make([]*unstructured.Unstructured, n)
			for j := range n {
				objs[j] = k.make(ns, fmt.Sprintf("%s-%d", k.name, j), "")
				wg.Go(func() { create(ctx, t, c, objs[j]) })
			}
			wg.Wait()
			for _, o := range objs {
				a := settled(t, c, k, o)
				live.add(t, k.name+"/"+o.GetName(), a)
				checkNetwork(t, k, o, a)
			}
			kept[k.name] = objs[0]
			if k.name == "neonvm" {
				if m := str(objs[0], "status", "extraNetMask"); m != "255.255.255.0" {
					t.Errorf("status.extraNetMask is %q, want 255.255.255.0", m)
				}
			}
		})
		static := fmt.Sprintf("10.71.0.%d", 200+i)
		t.Run(k.name+"/static request and release into cooldown", func(t *testing.T) {
			obj := k.make(ns, k.name+"-static", static)
			create(ctx, t, c, obj)
			if got := settled(t, c, k, obj); got != static {
				t.Fatalf("asked for %s, got %s", static, got)
			}
			if err := c.Delete(ctx, obj); err != nil {
				t.Fatal(err)
			}
			harness.Eventually(t, 30*time.Second, "the static one to go", func() error {
				if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); !apierrors.IsNotFound(err) {
					return fmt.Errorf("still there (%w)", err)
				}
				return nil
			})
			again := k.make(ns, k.name+"-static-again", static)
			err := c.Create(ctx, again)
			if err == nil || !strings.Contains(err.Error(), "cools down until") {
				t.Fatalf("asking for %s after its release: %v; want a refusal saying it cools down", static, err)
			}
		})
	}
	t.Run("neonvm/out of scope", func(t *testing.T) {
		obj := kinds[1].make(ns, "neonvm-no-extra-net", "")
		_ = unstructured.SetNestedField(obj.Object, false, "spec", "extraNetwork", "enable")
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			t.Fatal(err)
		}
		if len(obj.GetAnnotations()) > 0 || len(obj.GetFinalizers()) > 0 || str(obj, "status", "extraNetIP") != "" {
			t.Errorf("a VM with no extra network was given an address: %v", obj.Object)
		}
	})

	t.Run("neonvm/extra network enabled after the create", func(t *testing.T) {
		obj := kinds[1].make(ns, "neonvm-enabled-later", "")
		_ = unstructured.SetNestedField(obj.Object, false, "spec", "extraNetwork", "enable")
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
		_ = unstructured.SetNestedField(obj.Object, true, "spec", "extraNetwork", "enable")
		if err := c.Update(ctx, obj); err != nil {
			t.Fatal(err)
		}
		// The webhook runs on create only: vmipam's controller gives it
		// one, as to any object in scope that has none.
		live.add(t, "neonvm/"+obj.GetName(), settled(t, c, kinds[1], obj))
	})
	t.Run("a user cannot forge vmipam's stamp", func(t *testing.T) {
		user, err := cl.Env.AddUser(envtest.User{Name: "alice", Groups: []string{"team-a"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		rbac := []client.Object{
			&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "vm-editor"}, Rules: []rbacv1.PolicyRule{{
				APIGroups: []string{"vmipam.io", "vm.neon.tech"}, Resources: []string{"virtualmachines", "virtualmachines/status"}, Verbs: []string{"*"},
			}}},
			&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "alice-vm-editor"},
				RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "vm-editor"},
				Subjects: []rbacv1.Subject{{Kind: "User", Name: "alice"}}},
		}
		for _, o := range rbac {
			if err := c.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
		alice, err := client.New(user.Config(), client.Options{Scheme: c.Scheme(), Mapper: c.RESTMapper()})
		if err != nil {
			t.Fatal(err)
		}
		// Out of scope, so no address: then a stamp and a status address
		// written by hand, as if vmipam had given them.
		obj := kinds[1].make(ns, "neonvm-forged", "")
		_ = unstructured.SetNestedField(obj.Object, false, "spec", "extraNetwork", "enable")
		if err := alice.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
		obj.SetAnnotations(map[string]string{vmipamv1.TokenAnnotation: "forged", vmipamv1.PoolAnnotation: "kinds", vmipamv1.AddressAnnotation: "10.71.0.240"})
		if err := alice.Update(ctx, obj); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "is written by vmipam only") {
			t.Errorf("a user writing vmipam's stamp: %v; want it refused", err)
		}
		vm := kinds[0].make(ns, "vm-forged", "")
		vm.SetLabels(map[string]string{"later-webhook": "no"})
		create(ctx, t, c, vm)
		settled(t, c, kinds[0], vm)
		if err := c.Get(ctx, client.ObjectKeyFromObject(vm), vm); err != nil {
			t.Fatal(err)
		}
		ann := vm.GetAnnotations()
		ann[vmipamv1.AddressAnnotation] = "10.71.0.241"
		vm.SetAnnotations(ann)
		kinds[0].set(vm, "10.71.0.241")
		if err := alice.Update(ctx, vm); !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
			t.Errorf("a user moving a VM to an address with a stamp of their own: %v; want it refused", err)
		}
	})

	// A mutating webhook called after vmipam's that changes the address
	// it stamped: the API server refuses the create (vmipam's policy).
	for _, k := range kinds {
		t.Run(k.name+"/a later webhook changes the address", func(t *testing.T) {
			srv := laterWebhook(t, k)
			ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
			cfg := &admissionregv1.MutatingWebhookConfiguration{
				ObjectMeta: metav1.ObjectMeta{Name: "zz-later-" + k.name},
				Webhooks: []admissionregv1.MutatingWebhook{{
					Name: "later.example.com", AdmissionReviewVersions: []string{"v1"},
					ClientConfig: admissionregv1.WebhookClientConfig{URL: ptr.To(srv.URL), CABundle: ca},
					Rules: []admissionregv1.RuleWithOperations{{
						Operations: []admissionregv1.OperationType{admissionregv1.Create},
						Rule:       admissionregv1.Rule{APIGroups: []string{k.gvk.Group}, APIVersions: []string{k.gvk.Version}, Resources: []string{"virtualmachines"}},
					}},
					ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"later-webhook": "yes"}},
					SideEffects:    ptr.To(admissionregv1.SideEffectClassNone),
					FailurePolicy:  ptr.To(admissionregv1.Fail),
				}},
			}
			if err := c.Create(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Delete(context.Background(), cfg) })
			// A namespace of its own: each refused create leaves a
			// reservation pending until its TTL, and a namespace may have
			// only so many.
			obj := k.make("kinds-later-"+k.name, k.name+"-overridden", "")
			if err := c.Create(ctx, object(schema.GroupVersionKind{Version: "v1", Kind: "Namespace"}, "", obj.GetNamespace(), map[string]any{})); err != nil {
				t.Fatal(err)
			}
			obj.SetLabels(map[string]string{"later-webhook": "yes"})
			want := "must be the address vmipam reserved"
			if k.name == "neonvm" {
				want = "another mutating webhook removed the address vmipam reserved"
			}
			// The new configuration takes a moment to reach the API server's
			// admission chain.
			harness.Eventually(t, 30*time.Second, "the create to be refused", func() error {
				err := c.Create(ctx, obj.DeepCopy())
				if err == nil {
					_ = c.Delete(ctx, obj)
					return errors.New("created")
				}
				if !strings.Contains(err.Error(), want) {
					return fmt.Errorf("refused, but not saying %q: %w", want, err)
				}
				return nil
			})
		})
	}

	// vmipam stopped: the API server alone refuses a change of address,
	// lets other updates through, and creates needing no address go on.
	if err := p.Stop(30 * time.Second); err != nil {
		t.Fatalf("stop vmipam: %v", err)
	}
	for _, k := range kinds {
		t.Run(k.name+"/immutable while vmipam is stopped", func(t *testing.T) {
			obj := kept[k.name].DeepCopy()
			if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
				t.Fatal(err)
			}
			moved := obj.DeepCopy()
			k.set(moved, "10.71.0.250")
			err := k.update(ctx, c, moved)
			if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), k.refusal) {
				t.Fatalf("changing the address: %v; want a refusal saying %q", err, k.refusal)
			}
			labels := obj.GetLabels()
			labels["team"] = "db"
			obj.SetLabels(labels)
			if err := c.Update(ctx, obj); err != nil {
				t.Fatalf("an update leaving the address alone, with vmipam stopped: %v", err)
			}
		})
	}
	t.Run("neonvm/out of scope while vmipam is stopped", func(t *testing.T) {
		obj := kinds[1].make(ns, "neonvm-no-extra-net-2", "")
		_ = unstructured.SetNestedField(obj.Object, false, "spec", "extraNetwork", "enable")
		if err := c.Create(ctx, obj); err != nil {
			t.Fatalf("a create that needs no address failed while vmipam is stopped: %v", err)
		}
	})

	// Restarted, vmipam knows every address still held.
	p = start()
	for _, k := range kinds {
		t.Run(k.name+"/after a restart", func(t *testing.T) {
			var objs []*unstructured.Unstructured
			for j := range 4 {
				o := k.make(ns, fmt.Sprintf("%s-after-%d", k.name, j), "")
				create(ctx, t, c, o)
				objs = append(objs, o)
			}
			for _, o := range objs {
				a := settled(t, c, k, o)
				live.add(t, k.name+"/"+o.GetName(), a)
				checkNetwork(t, k, o, a)
			}
			held := k.address(kept[k.name])
			err := c.Create(ctx, k.make(ns, k.name+"-taken", held))
			if err == nil || !strings.Contains(err.Error(), "is allocated to") {
				t.Fatalf("asking for %s, held by %s: %v; want a refusal saying it is allocated", held, kept[k.name].GetName(), err)
			}
		})
	}
}

// laterWebhook serves a mutating webhook that moves every object's address
// to 10.71.0.99, as a careless webhook called after vmipam's could.
func laterWebhook(t *testing.T, k kind) *httptest.Server {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var review admissionv1.AdmissionReview
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		obj := &unstructured.Unstructured{}
		_ = obj.UnmarshalJSON(review.Request.Object.Raw)
		before, _ := obj.MarshalJSON()
		if k.name == "neonvm" {
			// Status is dropped on create: what a later webhook can do is
			// remove vmipam's record of the address.
			kinds1.RemoveAnnotation(obj, vmipamv1.AddressAnnotation)
		} else {
			k.set(obj, "10.71.0.99")
		}
		after, _ := obj.MarshalJSON()
		ops, err := jsonpatch.CreatePatch(before, after)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		patch, _ := json.Marshal(ops)
		pt := admissionv1.PatchTypeJSONPatch
		review.Response = &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true, Patch: patch, PatchType: &pt}
		review.Request = nil
		_ = json.NewEncoder(w).Encode(review)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestMissingCRD: a configured kind whose CRD is not installed is waited
// for, with the CRD named in the log and vmipam_kind_served at 0, while the
// other kinds are served; once the CRD is installed, its objects get
// addresses.
func TestMissingCRD(t *testing.T) {
	harness.NeedControlPlane(t)
	ctx := t.Context()
	cfg := filepath.Join(t.TempDir(), "kinds.yaml")
	if err := os.WriteFile(cfg, []byte(`apiVersion: vmipam.io/v1alpha1
kind: KindsConfiguration
kinds:
- {group: vmipam.io, version: v1alpha1, kind: VirtualMachine, resource: virtualmachines, pool: {field: spec.ipPool}, address: {field: spec.addresses}}
- {group: late.example.com, version: v1, kind: Box, resource: boxes, address: {annotation: {key: late.example.com/ip}}}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cl, err := harness.StartWith(ctx, root, t.TempDir(), harness.ClusterOptions{KindsConfig: cfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Stop() })
	var logs harness.LogBuffer
	p, err := cl.StartVMIPAM(ctx, &logs)
	if err != nil {
		t.Fatalf("vmipam does not start with a kind whose CRD is missing: %v\nlogs:\n%s", err, logs.String())
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("vmipam's logs:\n%s", logs.String())
		}
	})
	c := cl.Client
	if err := c.Create(ctx, fixture.Pool("late", fixture.WithDefault(), fixture.WithCIDRs("10.72.0.0/24"))); err != nil {
		t.Fatal(err)
	}
	own := kinds[0]
	vm := own.make("default", "served", "")
	create(ctx, t, c, vm)
	settled(t, c, own, vm)
	if !strings.Contains(logs.String(), "waiting for its CRD") || !strings.Contains(logs.String(), "boxes.late.example.com") {
		t.Errorf("the log does not say which CRD vmipam waits for")
	}
	served := func(v string) func() error {
		return func() error {
			m, err := cl.Metrics()
			if err != nil {
				return err
			}
			if want := `vmipam_kind_served{group="late.example.com",kind="Box",version="v1"} ` + v; !strings.Contains(m, want) {
				return fmt.Errorf("metrics lack %s", want)
			}
			return nil
		}
	}
	harness.Eventually(t, 10*time.Second, "vmipam_kind_served 0", served("0"))

	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": "boxes.late.example.com"},
		"spec": map[string]any{
			"group": "late.example.com", "scope": "Namespaced",
			"names": map[string]any{"kind": "Box", "listKind": "BoxList", "plural": "boxes", "singular": "box"},
			"versions": []any{map[string]any{"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}},
		},
	}}
	if err := c.Create(ctx, crd); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 60*time.Second, "vmipam_kind_served 1", served("1"))
	box := object(schema.GroupVersionKind{Group: "late.example.com", Version: "v1", Kind: "Box"}, "default", "box", map[string]any{})
	create(ctx, t, c, box)
	harness.Eventually(t, 30*time.Second, "the box to be given an address and bound", func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(box), box); err != nil {
			return err
		}
		a := box.GetAnnotations()["late.example.com/ip"]
		if _, err := netip.ParseAddr(a); err != nil || !strings.HasPrefix(a, "10.72.0.") {
			return fmt.Errorf("address %q", a)
		}
		return nil
	})
	// Its controller runs: the delete releases the address and removes
	// the finalizer.
	if err := c.Delete(ctx, box); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 30*time.Second, "the box to go", func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(box), box); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (finalizers %v): %w", box.GetFinalizers(), err)
		}
		return nil
	})
}
