package replicas

import (
	"bytes"
	"context"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ctl"
	"github.com/vmipam/vmipam/history"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kubestore"
	"github.com/vmipam/vmipam/test/fixture"
	"github.com/vmipam/vmipam/test/harness"
)

// pluginRun runs kubectl-vmipam in-process against the shared control
// plane with args, and returns its output and exit code.
func pluginRun(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	root := ctl.NewRoot(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	root.SetArgs(append([]string{"--kubeconfig", cluster.Kubeconfig, "--vmipam-namespace", harness.Namespace}, args...))
	err := root.ExecuteContext(t.Context())
	if err != nil && !ctl.Silent(err) {
		out.WriteString("error: " + err.Error() + "\n")
	}
	t.Logf("$ kubectl vmipam %s  (exit %d)\n%s", strings.Join(args, " "), ctl.ExitCode(err), out.String())
	return out.String(), ctl.ExitCode(err)
}

// pluginWant fails t unless out holds every one of wants.
func pluginWant(t *testing.T, what, out string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Errorf("%s: output lacks %q", what, w)
		}
	}
}

// TestPluginThreeReplicas runs kubectl vmipam's who, history and pools
// against three replicas that gave VMs their addresses, and its release
// against the IPRelease contract, the test playing vmipam's part.
func TestPluginThreeReplicas(t *testing.T) {
	s := newSuite(t)
	s.startReplicas(3)
	const pool = "plugin-pool"
	p := fixture.Pool(pool, fixture.WithCooldown(time.Hour), fixture.WithRanges(vmipamv1.IPRange{
		CIDR: "10.77.0.0/24", Gateway: "10.77.0.1", Exclude: []string{"10.77.0.10"},
	}))
	if err := s.c.Create(s.ctx, p); err != nil {
		t.Fatalf("create IPPool %s: %v", pool, err)
	}
	s.pools = append(s.pools, pool)
	s.waitServing(pool, 60*time.Second)

	const n = 9
	vms := make([]*vmipamv1.VirtualMachine, n)
	for i := range vms {
		vm, err := s.create(s.ctx, "vm-"+string(rune('a'+i)), pool)
		if err != nil {
			t.Fatal(err)
		}
		vms[i] = vm
	}
	blocks, err := kubestore.Read(s.ctx, s.c, pool)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("who: each VM's address is allocated to it, claimed by a live replica", func(t *testing.T) {
		harness.Eventually(t, 20*time.Second, "the replicas to write their claims", func() error {
			blocks, err = kubestore.Read(s.ctx, s.c, pool)
			return err
		})
		for _, vm := range vms {
			addr := vm.Spec.Addresses[0]
			out, code := pluginRun(t, "who", addr, "-o", "json")
			if code != ctl.ExitOK {
				t.Fatalf("who %s exited %d", addr, code)
			}
			var w ctl.Who
			if err := json.Unmarshal([]byte(out), &w); err != nil {
				t.Fatal(err)
			}
			a := netip.MustParseAddr(addr)
			var claim string
			for _, b := range blocks {
				if b.Prefix == ipam.BlockOf(a) {
					claim, _ = b.ClaimedBy(a)
				}
			}
			switch {
			case w.Pool != pool || w.Family != "IPv4" || w.State != ctl.StateAllocated:
				t.Errorf("who %s = pool %q family %q state %q, want %s IPv4 allocated", addr, w.Pool, w.Family, w.State, pool)
			case len(w.Objects) != 1 || w.Objects[0].Name != vm.Name || w.Objects[0].UID != string(vm.UID) || w.Objects[0].Kind != "VirtualMachine.vmipam.io":
				t.Errorf("who %s objects = %+v, want VirtualMachine %s/%s uid %s", addr, w.Objects, vm.Namespace, vm.Name, vm.UID)
			case claim == "" || w.Claim != claim:
				t.Errorf("who %s claim = %q, the block says %q", addr, w.Claim, claim)
			case w.ClaimHolder == nil || !w.ClaimHolder.Live:
				t.Errorf("who %s: the claim's replica %q is not seen live: %+v", addr, w.Claim, w.ClaimHolder)
			}
		}
		out, _ := pluginRun(t, "who", vms[0].Spec.Addresses[0])
		pluginWant(t, "who table", out, "State:    allocated", vms[0].Namespace+"/"+vms[0].Name, "uid="+string(vms[0].UID), "(live, renewed")
	})

	t.Run("who: reserved addresses and an address of no pool", func(t *testing.T) {
		out, code := pluginRun(t, "who", "10.77.0.1")
		pluginWant(t, "gateway", out, "State:    gateway (ranges[0].gateway)")
		if code != ctl.ExitOK {
			t.Errorf("who gateway exited %d", code)
		}
		out, _ = pluginRun(t, "who", "10.77.0.10")
		pluginWant(t, "excluded", out, "State:    excluded (ranges[0].exclude)")
		out, _ = pluginRun(t, "who", "10.77.0.255")
		pluginWant(t, "broadcast", out, "broadcast address")
		out, code = pluginRun(t, "who", "10.78.0.1")
		pluginWant(t, "no pool", out, "10.78.0.1 is in no pool's ranges", "10.77.0.0/24 (plugin-pool)")
		if code != ctl.ExitError {
			t.Errorf("who of no pool exited %d, want %d", code, ctl.ExitError)
		}
		if _, code := pluginRun(t, "who", "10.77.0.x"); code != ctl.ExitError {
			t.Errorf("who of no address exited %d, want %d", code, ctl.ExitError)
		}
	})

	t.Run("who: a claimed address no VM carries is free, armed or not, on its replica", func(t *testing.T) {
		used := map[netip.Addr]bool{}
		for _, vm := range vms {
			used[netip.MustParseAddr(vm.Spec.Addresses[0])] = true
		}
		var addr netip.Addr
		var claim string
		for _, b := range blocks {
			for a := b.Prefix.Addr(); b.Prefix.Contains(a) && !addr.IsValid(); a = a.Next() {
				if h, ok := b.ClaimedBy(a); ok && !used[a] && a.As4()[3] > 11 && a.As4()[3] < 255 {
					addr, claim = a, h
				}
			}
		}
		if !addr.IsValid() {
			t.Fatal("no claimed address without a VM in the pool's blocks")
		}
		out, _ := pluginRun(t, "who", addr.String(), "-o", "json")
		var w ctl.Who
		if err := json.Unmarshal([]byte(out), &w); err != nil {
			t.Fatal(err)
		}
		if (w.State != ctl.StateFree && w.State != ctl.StateArmed) || w.Claim != claim || len(w.Objects) != 0 {
			t.Errorf("who %s = %q claimed by %q, objects %v; want free or armed, claimed by %s, no object", addr, w.State, w.Claim, w.Objects, claim)
		}
	})

	gone := vms[n-1]
	goneAddr := gone.Spec.Addresses[0]
	t.Run("who: a deleted VM's address cools down", func(t *testing.T) {
		if err := s.c.Delete(s.ctx, gone); err != nil {
			t.Fatal(err)
		}
		harness.Eventually(t, 30*time.Second, "the address to be written into its cooldown", func() error {
			out, _ := pluginRun(t, "who", goneAddr, "-o", "json")
			var w ctl.Who
			if err := json.Unmarshal([]byte(out), &w); err != nil {
				return err
			}
			if w.State != ctl.StateCooldown || w.Until.Before(time.Now().Add(50*time.Minute)) {
				return &pluginErr{"state " + w.State + " until " + w.Until.String()}
			}
			return nil
		})
	})

	t.Run("history: records newest first, the live holder first, --at and --since", func(t *testing.T) {
		// The history writer is not part of this change: the test writes
		// a segment of the chunk as vmipam's would.
		live := vms[0]
		addr := netip.MustParseAddr(live.Spec.Addresses[0])
		chunk := history.ChunkOf(addr)
		at := func(h int) *metav1.Time {
			t := metav1.NewTime(time.Now().Add(-time.Duration(h) * time.Hour).Truncate(time.Second))
			return &t
		}
		seg := &vmipamv1.IPHistory{
			ObjectMeta: metav1.ObjectMeta{Name: history.SegmentName(chunk, 0), Labels: map[string]string{vmipamv1.ChunkLabel: history.ChunkLabelValue(chunk)}},
			Spec: vmipamv1.IPHistorySpec{Pool: pool, Chunk: chunk.String(), Sequence: 0, Records: []vmipamv1.AddressRecord{
				{Address: addr.String(), Kind: "VirtualMachine.vmipam.io", Namespace: s.ns, Name: "old-1", UID: "00000000-0000-0000-0000-000000000001", From: at(30), To: *at(26), Ended: vmipamv1.EndedAllocated},
				{Address: addr.String(), Kind: "VirtualMachine.vmipam.io", Namespace: s.ns, Name: "old-2", UID: "00000000-0000-0000-0000-000000000002", From: at(20), To: *at(5), Ended: vmipamv1.EndedAllocated},
				{Address: addr.String(), To: *at(4), Ended: vmipamv1.EndedCooldown, ReleasedBy: "alice", Reason: "INC-7"},
				{Address: "10.77.0.250", Kind: "VirtualMachine.vmipam.io", Namespace: s.ns, Name: "other", UID: "00000000-0000-0000-0000-000000000003", From: at(3), To: *at(2), Ended: vmipamv1.EndedAllocated},
			}},
		}
		if err := s.c.Create(s.ctx, seg); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.c.Delete(context.Background(), seg) })

		out, code := pluginRun(t, "history", addr.String())
		if code != ctl.ExitOK {
			t.Fatalf("history exited %d", code)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 5 {
			t.Fatalf("history: %d lines, want a header and 4 rows (live, release, old-2, old-1)", len(lines))
		}
		pluginWant(t, "header", lines[0], "FROM", "TO", "ENDED", "KIND", "NAMESPACE/NAME", "UID", "RELEASED-BY", "REASON")
		pluginWant(t, "row 1: the live VM", lines[1], "now", "Live", s.ns+"/"+live.Name, string(live.UID))
		pluginWant(t, "row 2: the release", lines[2], "Cooldown", "alice", "INC-7")
		pluginWant(t, "row 3: old-2", lines[3], s.ns+"/old-2")
		pluginWant(t, "row 4: old-1", lines[4], s.ns+"/old-1")

		out, _ = pluginRun(t, "history", addr.String(), "--at", at(10).UTC().Format(time.RFC3339))
		lines = strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 || !strings.Contains(lines[1], s.ns+"/old-2") {
			t.Errorf("history --at 10h ago: %q, want old-2 alone", lines)
		}
		out, _ = pluginRun(t, "history", addr.String(), "--since", "6h")
		if strings.Contains(out, "old-1") || !strings.Contains(out, "old-2") || !strings.Contains(out, "INC-7") || !strings.Contains(out, live.Name) {
			t.Errorf("history --since 6h: want what ended in the last 6h (old-2 5h ago, the release) and the live VM, not old-1")
		}
		out, _ = pluginRun(t, "history", addr.String(), "--at", "28h")
		pluginWant(t, "--at 28h", out, "old-1")
		if _, code := pluginRun(t, "history", addr.String(), "--since", "yesterday"); code != ctl.ExitError {
			t.Errorf("history --since yesterday exited %d, want %d", code, ctl.ExitError)
		}
	})

	t.Run("pools: the pool's counts as its status has them", func(t *testing.T) {
		harness.Eventually(t, 30*time.Second, "the pool's status to count the VMs", func() error {
			out, code := pluginRun(t, "pools", "-o", "json")
			if code != ctl.ExitOK {
				return &pluginErr{"pools failed"}
			}
			var rows []ctl.PoolRow
			if err := json.Unmarshal([]byte(out), &rows); err != nil {
				return err
			}
			for _, r := range rows {
				if r.Pool != pool {
					continue
				}
				if r.Family != "IPv4" || !r.Ready || r.Usable != 252 || r.Allocated != n-1 || r.Cooldown != 1 {
					return &pluginErr{"row " + out}
				}
				return nil
			}
			return &pluginErr{"no row of " + pool}
		})
		out, _ := pluginRun(t, "pools")
		pluginWant(t, "pools table", out, "POOL", "EXHAUSTION", pool)
	})

	t.Run("release: the client side of the IPRelease contract", func(t *testing.T) {
		// vmipam's side of IPRelease is not part of this change: the
		// test plays the replica, writing the status it would.
		if _, code := pluginRun(t, "release", goneAddr, "--skip-cooldown"); code != ctl.ExitError {
			t.Errorf("release --skip-cooldown without --reason exited %d, want %d", code, ctl.ExitError)
		}
		var list vmipamv1.IPReleaseList
		if err := s.c.List(s.ctx, &list); err != nil || len(list.Items) != 0 {
			t.Fatalf("a refused flag created an IPRelease: %v %v", list.Items, err)
		}
		tests := map[string]struct {
			args     []string
			status   *vmipamv1.IPReleaseStatus
			wantCode int
			wants    []string
		}{
			"done": {args: []string{"release", goneAddr, "--skip-cooldown", "--reason", "INC-8"}, wantCode: ctl.ExitOK,
				status: &vmipamv1.IPReleaseStatus{Phase: vmipamv1.ReleaseDone, Message: "cooldown ended", Holder: "vmipam-1", Pool: pool, Previous: "Cooldown"},
				wants:  []string{"Done " + goneAddr, "(pool plugin-pool)", "was Cooldown", "by replica vmipam-1", "cooldown ended"}},
			// The refused and unanswered cases pass --skip-cooldown too: the
			// IPRelease CRD's rule on skipCooldown cannot yet evaluate an
			// object without it ("no such key").
			"refused": {args: []string{"release", vms[1].Spec.Addresses[0], "--skip-cooldown", "--reason", "INC-9"}, wantCode: ctl.ExitFindings,
				status: &vmipamv1.IPReleaseStatus{Phase: vmipamv1.ReleaseRefused, Message: "allocated to VirtualMachine " + s.ns + "/" + vms[1].Name},
				wants:  []string{"Refused", "allocated to VirtualMachine " + s.ns + "/" + vms[1].Name}},
			"nobody acts": {args: []string{"release", goneAddr, "--skip-cooldown", "--reason", "INC-10", "--timeout", "1s"}, wantCode: ctl.ExitFindings,
				wants: []string{"no vmipam replica acted on IPRelease release-", "within 1s"}},
		}
		for name, tt := range tests {
			t.Run(name, func(t *testing.T) {
				ctx, cancel := context.WithCancel(s.ctx)
				defer cancel()
				if tt.status != nil {
					go pluginPlayVMIPAM(ctx, s.c, *tt.status)
				}
				out, code := pluginRun(t, tt.args...)
				if code != tt.wantCode {
					t.Errorf("exit %d, want %d", code, tt.wantCode)
				}
				pluginWant(t, name, out, tt.wants...)
				cancel()
				_ = s.c.DeleteAllOf(s.ctx, &vmipamv1.IPRelease{})
			})
		}
	})
}

// pluginPlayVMIPAM plays vmipam's replica for release's test: it sets st
// on the first IPRelease without a phase.
func pluginPlayVMIPAM(ctx context.Context, c client.Client, st vmipamv1.IPReleaseStatus) {
	_ = harness.Poll(ctx, 50*time.Millisecond, 20*time.Second, func() error {
		var list vmipamv1.IPReleaseList
		if err := c.List(ctx, &list); err != nil {
			return err
		}
		for i := range list.Items {
			r := &list.Items[i]
			if r.Status.Phase == "" {
				r.Status = st
				now := metav1.Now()
				r.Status.CompletionTime = &now
				return c.Status().Update(ctx, r)
			}
		}
		return &pluginErr{"no IPRelease yet"}
	})
}

// pluginErr is a condition not met yet.
type pluginErr struct{ s string }

func (e *pluginErr) Error() string { return e.s }
