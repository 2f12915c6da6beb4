package replicas

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ctl"
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

	t.Run("history: the tenure vmipam recorded, the live holder first, --at and --since", func(t *testing.T) {
		// gone's tenure, as the replica that released its address wrote
		// it, and the VM now on another address of the same chunk.
		out, code := pluginRun(t, "history", goneAddr, "-o", "json")
		if code != ctl.ExitOK {
			t.Fatalf("history exited %d: %s", code, out)
		}
		lines := strings.Split(strings.TrimSpace(pluginTable(t, "history", goneAddr)), "\n")
		if len(lines) != 2 {
			t.Fatalf("history of %s: %q; want a header and gone's tenure", goneAddr, lines)
		}
		pluginWant(t, "header", lines[0], "FROM", "TO", "ENDED", "KIND", "NAMESPACE/NAME", "UID")
		pluginWant(t, "gone's tenure", lines[1], "Allocated", "VirtualMachine.vmipam.io", s.ns+"/"+gone.Name, string(gone.UID))
		mid := gone.CreationTimestamp.Add(time.Second / 2)
		if out := pluginTable(t, "history", goneAddr, "--at", mid.UTC().Format(time.RFC3339Nano)); !strings.Contains(out, gone.Name) {
			t.Errorf("history --at its lifetime: %q; want gone", out)
		}
		if out := pluginTable(t, "history", goneAddr, "--at", "48h"); strings.Contains(out, gone.Name) {
			t.Errorf("history --at 48h ago: %q; want nothing (gone was created minutes ago)", out)
		}
		live := vms[0]
		out = pluginTable(t, "history", live.Spec.Addresses[0], "--since", "1h")
		pluginWant(t, "the live VM", out, "Live", s.ns+"/"+live.Name, string(live.UID))
		if _, code := pluginRun(t, "history", goneAddr, "--since", "yesterday"); code != ctl.ExitError {
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

	t.Run("release: the replica holding the claim answers", func(t *testing.T) {
		if _, code := pluginRun(t, "release", goneAddr, "--skip-cooldown"); code != ctl.ExitError {
			t.Errorf("release --skip-cooldown without --reason exited %d, want %d", code, ctl.ExitError)
		}
		var list vmipamv1.IPReleaseList
		if err := s.c.List(s.ctx, &list); err != nil || len(list.Items) != 0 {
			t.Fatalf("a refused flag created an IPRelease: %v %v", list.Items, err)
		}
		// The ends of a pending reservation and of a cooldown that are
		// carried out wait a minute for creates in flight: the integration
		// suite runs them on a test clock (TestIPRelease).
		held := vms[1]
		tests := map[string]struct {
			args  []string
			addr  string
			wants []string
		}{
			"held by a live VM": {args: []string{"release", held.Spec.Addresses[0], "--skip-cooldown", "--reason", "INC-9"}, addr: held.Spec.Addresses[0],
				wants: []string{"Refused", "held by VirtualMachine " + s.ns + "/" + held.Name}},
			"cooling down, not asked to skip it": {args: []string{"release", goneAddr}, addr: goneAddr,
				wants: []string{"Refused", "cools down until"}},
			"a cooldown just begun": {args: []string{"release", goneAddr, "--skip-cooldown", "--reason", "INC-10"}, addr: goneAddr,
				wants: []string{"Refused", "try again after"}},
		}
		for name, tt := range tests {
			t.Run(name, func(t *testing.T) {
				blocks, err := kubestore.Read(s.ctx, s.c, pool)
				if err != nil {
					t.Fatal(err)
				}
				claim := pluginClaimOf(blocks, netip.MustParseAddr(tt.addr))
				out, code := pluginRun(t, tt.args...)
				if code != ctl.ExitFindings {
					t.Errorf("exit %d, want %d (refused)", code, ctl.ExitFindings)
				}
				pluginWant(t, name, out, append(tt.wants, "by replica "+claim)...)
			})
		}
	})
}

// pluginClaimOf returns the holder whose claim covers addr in blocks.
func pluginClaimOf(blocks []ipam.Block, addr netip.Addr) string {
	for i := range blocks {
		if blocks[i].Prefix.Contains(addr) {
			if h, ok := blocks[i].ClaimedBy(addr); ok {
				return h
			}
		}
	}
	return ""
}

// pluginTable runs the plugin and returns its output, failing on a
// non-zero exit.
func pluginTable(t *testing.T, args ...string) string {
	t.Helper()
	out, code := pluginRun(t, args...)
	if code != ctl.ExitOK {
		t.Fatalf("kubectl vmipam %s exited %d: %s", strings.Join(args, " "), code, out)
	}
	return out
}

// pluginErr is a condition not met yet.
type pluginErr struct{ s string }

func (e *pluginErr) Error() string { return e.s }
