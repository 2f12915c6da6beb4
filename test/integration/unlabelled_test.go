package integration

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/internal/app"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/test/harness"
)

// vmRequests records vmipam's requests for VirtualMachines.
type vmRequests struct {
	mu sync.Mutex
	// gets counts the reads of one VM, by name.
	gets map[string]int
	// unlabelled holds the Accept header of each watch of the VMs without
	// a holder label. (Recovery and the resync list them whole, which is
	// not this test's business.)
	unlabelled []string
	// lists counts the lists of the VMs without a holder label.
	lists int
}

func (c *vmRequests) RoundTrip(next http.RoundTripper, req *http.Request) (*http.Response, error) {
	const coll = "/virtualmachines"
	if i := strings.Index(req.URL.Path, coll); i >= 0 && req.Method == http.MethodGet {
		c.mu.Lock()
		switch name := strings.TrimPrefix(req.URL.Path[i+len(coll):], "/"); {
		case name != "":
			c.gets[name]++
		case !strings.HasPrefix(req.URL.Query().Get("labelSelector"), "!"+vmipamv1.HolderLabel):
		case req.URL.Query().Get("watch") == "true":
			c.unlabelled = append(c.unlabelled, req.Header.Get("Accept"))
		default:
			c.lists++
		}
		c.mu.Unlock()
	}
	return next.RoundTrip(req)
}

func (c *vmRequests) get(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gets[name]
}

func (c *vmRequests) listed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lists
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestUnmanagedWatchedAsMetadata: the VMs without a holder label are
// watched as metadata, and one vmipam found nothing to do for (here, an
// address outside every pool, as a VM created with no call to vmipam may
// carry) is read whole once, not again on events that change nothing
// vmipam reads: another finalizer's work, a label its kind does not read,
// its deletion. A change to its spec is read again; a VM created without
// the webhook with an address inside a pool is still claimed.
func TestUnmanagedWatchedAsMetadata(t *testing.T) {
	reqs := &vmRequests{gets: map[string]int{}}
	c := rest.CopyConfig(cfg)
	c.Wrap(func(next http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) { return reqs.RoundTrip(next, r) })
	})
	clk := clocktesting.NewFakeClock(epoch)
	// No resync in sight: it lists, and its findings are not the point.
	v := startVMIPAMOn(t, c, clk, func(o *app.Options) { o.ResyncInterval = time.Hour })
	ns := namespace(t)
	newPool(t, v, "unmanaged", []vmipamv1.IPRange{{CIDR: "10.86.0.0/24"}})
	p := v.reg.Get("unmanaged")
	bypassMutation(t)
	ctx := t.Context()

	const keep = "example.com/keep"
	// The first read of an unlabelled VM lists them all, and serves the
	// reads that follow from that list: that done, each read is a Get.
	listed := reqs.listed()
	first := vm(ns, "first", "", "192.0.2.9")
	if err := k8sClient.Create(ctx, first); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 15*time.Second, "a first read", func() error {
		if reqs.get(first.Name) == 0 && reqs.listed() == listed {
			return errors.New("neither read nor listed")
		}
		return nil
	})

	const n = 10
	objs := make([]*vmipamv1.VirtualMachine, n)
	for i := range objs {
		objs[i] = vm(ns, fmt.Sprintf("outside-%d", i), "", fmt.Sprintf("192.0.2.%d", 10+i))
		objs[i].Finalizers = []string{keep}
		if err := k8sClient.Create(ctx, objs[i]); err != nil {
			t.Fatal(err)
		}
	}
	for _, o := range objs {
		harness.Eventually(t, 15*time.Second, "a read of "+o.Name, func() error {
			if reqs.get(o.Name) == 0 {
				return fmt.Errorf("%s not read", o.Name)
			}
			return nil
		})
	}

	// A spec change (image) is read again; a label change is not, as
	// vmipam's own kind has no condition to read labels.
	changed := map[string]bool{objs[0].Name: true}
	objs[0].Spec.Image = "debian-14"
	objs[1].Labels = map[string]string{"app": "db"}
	for _, o := range objs[:2] {
		if err := k8sClient.Update(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	harness.Eventually(t, 15*time.Second, "a second read of "+objs[0].Name, func() error {
		if got := reqs.get(objs[0].Name); got != 2 {
			return fmt.Errorf("%s read %d times", objs[0].Name, got)
		}
		return nil
	})

	// Deleted: waiting on another finalizer, then gone.
	for _, o := range objs {
		if err := k8sClient.Delete(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	for _, o := range objs {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
			t.Fatal(err)
		}
		o.Finalizers = nil
		if err := k8sClient.Update(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	// One created without the webhook inside the pool is claimed, after
	// the events above: once it is, those were handled.
	inside := vm(ns, "inside", "", "10.86.0.9")
	if err := k8sClient.Create(ctx, inside); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 15*time.Second, "the address inside the pool bound", func() error {
		if err := wantState(p, netip.MustParseAddr("10.86.0.9"), ipam.StateAllocated); err != nil {
			return err
		}
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(inside), inside); err != nil {
			return err
		}
		if inside.Labels[vmipamv1.HolderLabel] != v.reg.HolderLabel() {
			return fmt.Errorf("labels %v", inside.Labels)
		}
		return nil
	})
	time.Sleep(time.Second)
	for _, o := range objs {
		want := 1
		if changed[o.Name] {
			want = 2
		}
		if got := reqs.get(o.Name); got != want {
			t.Errorf("%s read whole %d times, want %d", o.Name, got, want)
		}
	}
	reqs.mu.Lock()
	defer reqs.mu.Unlock()
	if len(reqs.unlabelled) == 0 {
		t.Error("no watch of the unlabelled VMs seen")
	}
	for _, accept := range reqs.unlabelled {
		if !strings.Contains(accept, "as=PartialObjectMetadata") {
			t.Errorf("a watch of the unlabelled VMs asked for %q, not metadata", accept)
		}
	}
}
