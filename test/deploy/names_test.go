package deploy

import (
	"bufio"
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/kinds/manifests"
	"github.com/vmipam/vmipam/test/harness"
)

// namesPeer is a resource another project installs in the clusters vmipam
// runs in, with the names kubectl resolves to it.
type namesPeer struct {
	project, group, plural, singular string
	shortNames, categories           []string
	// source is where the names were read (repository and path).
	source string
}

// namesPeers are the resources of the projects that share vmipam's
// clusters, read from their own manifests and CRD generators (found with
// code search, 2026-12). The names vmipam gives its kinds must not resolve
// to any of them: a short name, singular or plural here and in vmipam
// makes `kubectl get NAME` list one project's objects where the user meant
// the other's (kubectl picks one group, and says nothing of the other).
//
//	project     resource                                      short names            source
//	KubeVirt    virtualmachines.kubevirt.io                   vm, vms                kubevirt/kubevirt pkg/virt-operator/resource/generate/components/crds.go
//	KubeVirt    virtualmachineinstances.kubevirt.io           vmi, vmis              (same)
//	KubeVirt    virtualmachinepools.pool.kubevirt.io          vmpool, vmpools        (same)
//	KubeVirt    (migrations, replica sets, presets, snapshots, restores, exports, clones, instance types, preferences: see the list below)
//	NeonVM      virtualmachines.vm.neon.tech (singular neonvm) none                  neondatabase/autoscaling neonvm/config/crd/bases/vm.neon.tech_virtualmachines.yaml
//	NeonVM      ippools.vm.neon.tech                          none                   neondatabase/autoscaling neonvm/config/crd/bases/vm.neon.tech_ippools.yaml
//	Calico      ippools.crd.projectcalico.org                 none                   projectcalico/calico libcalico-go/config/crd/crd.projectcalico.org_ippools.yaml
//	Calico      ippools.projectcalico.org (v3)                none                   projectcalico/calico api/config/crd/projectcalico.org_ippools.yaml
//	Whereabouts ippools.whereabouts.cni.cncf.io               none                   k8snetworkplumbingwg/whereabouts doc/crds/whereabouts.cni.cncf.io_ippools.yaml
//	Kube-OVN    ippools.kubeovn.io                            ippool                 kubeovn/kube-ovn charts/kube-ovn-v2/crds/kube-ovn-crd.yaml
//	Kube-OVN    ips.kubeovn.io                                ip                     (same)
//	Spiderpool  spiderippools.spiderpool.spidernet.io         sp (category spiderpool) spidernet-io/spiderpool charts/spiderpool/crds/spiderpool.spidernet.io_spiderippools.yaml
//	Spiderpool  ippools.spiderpool.spidernet.io (older API)   none                   spidernet-io/spiderpool charts/spiderpool/crds/spiderpool.spidernet.io_ippools.yaml
//	Multus      network-attachment-definitions.k8s.cni.cncf.io net-attach-def        k8snetworkplumbingwg/multus-cni deployments/multus-daemonset.yml
//
// Unavoidable: vmipam's plurals virtualmachines and ippools are the same
// words (a resource's plural is its URL path, fixed by the API). Hence
// vmipam's short names vmivm and vmipool, its category vmipam, and
// documentation that writes the qualified names (virtualmachines.vmipam.io,
// ippools.vmipam.io): TestNoAmbiguousCommands holds it to that.
var namesPeers = []namesPeer{
	{"KubeVirt", "kubevirt.io", "virtualmachines", "virtualmachine", []string{"vm", "vms"}, []string{"all"}, "kubevirt/kubevirt pkg/virt-operator/resource/generate/components/crds.go"},
	{"KubeVirt", "kubevirt.io", "virtualmachineinstances", "virtualmachineinstance", []string{"vmi", "vmis"}, []string{"all"}, "(same)"},
	{"KubeVirt", "kubevirt.io", "virtualmachineinstancemigrations", "virtualmachineinstancemigration", []string{"vmim", "vmims"}, []string{"all"}, "(same)"},
	{"KubeVirt", "kubevirt.io", "virtualmachineinstancereplicasets", "virtualmachineinstancereplicaset", []string{"vmirs", "vmirss"}, []string{"all"}, "(same)"},
	{"KubeVirt", "kubevirt.io", "virtualmachineinstancepresets", "virtualmachineinstancepreset", []string{"vmipreset", "vmipresets"}, []string{"all"}, "(same)"},
	{"KubeVirt", "kubevirt.io", "kubevirts", "kubevirt", []string{"kv", "kvs"}, []string{"all"}, "(same)"},
	{"KubeVirt", "pool.kubevirt.io", "virtualmachinepools", "virtualmachinepool", []string{"vmpool", "vmpools"}, []string{"all"}, "(same)"},
	{"KubeVirt", "snapshot.kubevirt.io", "virtualmachinesnapshots", "virtualmachinesnapshot", []string{"vmsnapshot", "vmsnapshots"}, []string{"all"}, "(same)"},
	{"KubeVirt", "snapshot.kubevirt.io", "virtualmachinesnapshotcontents", "virtualmachinesnapshotcontent", []string{"vmsnapshotcontent", "vmsnapshotcontents"}, []string{"all"}, "(same)"},
	{"KubeVirt", "snapshot.kubevirt.io", "virtualmachinerestores", "virtualmachinerestore", []string{"vmrestore", "vmrestores"}, []string{"all"}, "(same)"},
	{"KubeVirt", "export.kubevirt.io", "virtualmachineexports", "virtualmachineexport", []string{"vmexport", "vmexports"}, []string{"all"}, "(same)"},
	{"KubeVirt", "clone.kubevirt.io", "virtualmachineclones", "virtualmachineclone", []string{"vmclone", "vmclones"}, []string{"all"}, "(same)"},
	{"KubeVirt", "instancetype.kubevirt.io", "virtualmachineinstancetypes", "virtualmachineinstancetype", []string{"vminstancetype", "vminstancetypes", "vmf", "vmfs"}, []string{"all"}, "(same)"},
	{"KubeVirt", "instancetype.kubevirt.io", "virtualmachineclusterinstancetypes", "virtualmachineclusterinstancetype", []string{"vmclusterinstancetype", "vmclusterinstancetypes", "vmcf", "vmcfs"}, nil, "(same)"},
	{"KubeVirt", "instancetype.kubevirt.io", "virtualmachinepreferences", "virtualmachinepreference", []string{"vmpref", "vmprefs", "vmp", "vmps"}, []string{"all"}, "(same)"},
	{"KubeVirt", "instancetype.kubevirt.io", "virtualmachineclusterpreferences", "virtualmachineclusterpreference", []string{"vmcp", "vmcps"}, nil, "(same)"},
	{"NeonVM", "vm.neon.tech", "virtualmachines", "neonvm", nil, nil, "neondatabase/autoscaling neonvm/config/crd/bases/vm.neon.tech_virtualmachines.yaml"},
	{"NeonVM", "vm.neon.tech", "ippools", "ippool", nil, nil, "neondatabase/autoscaling neonvm/config/crd/bases/vm.neon.tech_ippools.yaml"},
	{"Calico", "crd.projectcalico.org", "ippools", "ippool", nil, nil, "projectcalico/calico libcalico-go/config/crd/crd.projectcalico.org_ippools.yaml"},
	{"Calico", "projectcalico.org", "ippools", "ippool", nil, nil, "projectcalico/calico api/config/crd/projectcalico.org_ippools.yaml"},
	{"Whereabouts", "whereabouts.cni.cncf.io", "ippools", "ippool", nil, nil, "k8snetworkplumbingwg/whereabouts doc/crds/whereabouts.cni.cncf.io_ippools.yaml"},
	{"Kube-OVN", "kubeovn.io", "ippools", "ippool", []string{"ippool"}, nil, "kubeovn/kube-ovn charts/kube-ovn-v2/crds/kube-ovn-crd.yaml"},
	{"Kube-OVN", "kubeovn.io", "ips", "ip", []string{"ip"}, nil, "(same)"},
	{"Spiderpool", "spiderpool.spidernet.io", "spiderippools", "spiderippool", []string{"sp"}, []string{"spiderpool"}, "spidernet-io/spiderpool charts/spiderpool/crds/spiderpool.spidernet.io_spiderippools.yaml"},
	{"Spiderpool", "spiderpool.spidernet.io", "ippools", "ippool", nil, nil, "spidernet-io/spiderpool charts/spiderpool/crds/spiderpool.spidernet.io_ippools.yaml"},
	{"Multus", "k8s.cni.cncf.io", "network-attachment-definitions", "network-attachment-definition", []string{"net-attach-def"}, nil, "k8snetworkplumbingwg/multus-cni deployments/multus-daemonset.yml"},
}

// namesCategorised are vmipam's resources in the category vmipam: what
// an operator reads and acts on. IPBlock and IPBlockShare are left out:
// they are vmipam's own bookkeeping (per pool, a block per replica's claim
// and a share per holder), never edited by hand, and listing them beside
// the pools and VMs would bury those; so is IPHistory, a segment per
// chunk of 256 addresses, which kubectl vmipam history reads.
var namesCategorised = []string{"virtualmachines", "ippools", "ipreleases"}

// namesOwnCRDs reads vmipam's generated CRDs (deploy/crd).
func namesOwnCRDs(t *testing.T) []apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "deploy", "crd", "vmipam.io_*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRD in deploy/crd (%v)", err)
	}
	var crds []apiextensionsv1.CustomResourceDefinition
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(b, &crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		crds = append(crds, crd)
	}
	return crds
}

// TestNamesDoNotCollide checks that no short name of vmipam's CRDs is a
// name (plural, singular, short name or category) of a peer's resource,
// and that the kinds an operator works with are in the category vmipam,
// the bookkeeping kinds not.
func TestNamesDoNotCollide(t *testing.T) {
	peerNames := map[string][]string{}
	for _, p := range namesPeers {
		for _, n := range slices.Concat([]string{p.plural, p.singular}, p.shortNames, p.categories) {
			peerNames[n] = append(peerNames[n], p.project+" "+p.plural+"."+p.group)
		}
	}
	crds := namesOwnCRDs(t)
	if len(crds) < 6 {
		t.Fatalf("%d CRDs in deploy/crd, want vmipam's six", len(crds))
	}
	for _, crd := range crds {
		n := crd.Spec.Names
		for _, s := range n.ShortNames {
			if who := peerNames[s]; len(who) > 0 {
				t.Errorf("%s: short name %q is also a name of %s: `kubectl get %s` would be ambiguous", crd.Name, s, strings.Join(who, ", "), s)
			}
			if !strings.HasPrefix(s, "vmi") {
				t.Errorf("%s: short name %q does not start with vmi, as vmipam's others do", crd.Name, s)
			}
		}
		if who := peerNames[n.Singular]; len(who) > 0 && !slices.Contains([]string{"virtualmachine", "ippool"}, n.Singular) {
			t.Errorf("%s: singular %q is also a name of %s", crd.Name, n.Singular, strings.Join(who, ", "))
		}
		if slices.Contains(namesCategorised, n.Plural) {
			if !slices.Equal(n.Categories, []string{"vmipam"}) {
				t.Errorf("%s: categories %v, want [vmipam] (kubectl get vmipam)", crd.Name, n.Categories)
			}
			if len(n.ShortNames) == 0 {
				t.Errorf("%s: no short name", crd.Name)
			}
		} else if len(n.Categories) != 0 {
			t.Errorf("%s: categories %v, want none: vmipam's bookkeeping stays out of `kubectl get vmipam`", crd.Name, n.Categories)
		}
	}
	for _, want := range map[string]string{"virtualmachines": "vmivm", "ippools": "vmipool"} {
		found := false
		for _, crd := range crds {
			found = found || slices.Contains(crd.Spec.Names.ShortNames, want)
		}
		if !found {
			t.Errorf("no CRD has the short name %s, which the README and the chart's notes use", want)
		}
	}
}

// namesAmbiguous are the resource names that a cluster with KubeVirt,
// NeonVM, Calico, Whereabouts or Kube-OVN resolves to another project's
// kind (or, for ipp, vmipam's earlier short name, which no longer
// resolves to vmipam's), with what to write instead.
var namesAmbiguous = map[string]string{
	"vm":              "virtualmachines.vmipam.io or vmivm",
	"vms":             "virtualmachines.vmipam.io or vmivm",
	"virtualmachine":  "virtualmachines.vmipam.io or vmivm",
	"virtualmachines": "virtualmachines.vmipam.io or vmivm",
	"ippool":          "ippools.vmipam.io or vmipool",
	"ippools":         "ippools.vmipam.io or vmipool",
	"ipp":             "ippools.vmipam.io or vmipool",
}

// namesResourceVerbs are the kubectl commands whose first argument is a
// resource.
var namesResourceVerbs = map[string]bool{
	"get": true, "describe": true, "edit": true, "delete": true, "explain": true, "patch": true,
	"label": true, "annotate": true, "wait": true, "scale": true,
}

// namesValueFlags are the kubectl flags that take the next word as their
// value when written without =.
var namesValueFlags = map[string]bool{
	"-n": true, "--namespace": true, "-o": true, "--output": true, "-l": true, "--selector": true,
	"--kubeconfig": true, "--context": true, "--cluster": true, "--user": true, "-c": true, "--container": true,
	"--field-selector": true, "--sort-by": true, "-f": true, "--filename": true, "--template": true,
	"-L": true, "--label-columns": true, "--for": true, "--timeout": true, "--type": true, "-p": true,
	"--patch": true, "--chunk-size": true, "-s": true, "--server": true, "--token": true, "--as": true,
	"--cache-dir": true, "--request-timeout": true,
}

// namesAmbiguousCommands returns, for one line, each resource name that a
// kubectl command on it names ambiguously. shell says the line is a shell
// script's, where k stands for kubectl (hack/local.sh's function).
func namesAmbiguousCommands(line string, shell bool) []string {
	words := strings.Fields(line)
	var found []string
	for i := 0; i < len(words); i++ {
		// The command word, out of the code span, string or
		// substitution it may open: `kubectl, "$kubectl, $(k, ${kubectl}.
		w := words[i]
		if k := strings.LastIndexAny(w, "`\"'({"); k >= 0 {
			w = w[k+1:]
		}
		w = strings.Trim(strings.TrimPrefix(w, "$"), "}`\"'")
		if path.Base(w) != "kubectl" && (!shell || w != "k") {
			continue
		}
		// The command's words, up to the end of the command (a pipe, a
		// list operator, the end of inline code or of a string).
		var cmd []string
		for _, a := range words[i+1:] {
			cut := strings.IndexAny(a, "`|;&)\"'<>")
			if cut >= 0 {
				if cut > 0 {
					cmd = append(cmd, a[:cut])
				}
				break
			}
			cmd = append(cmd, a)
		}
		if r, ok := namesResourceArg(cmd); ok {
			for part := range strings.SplitSeq(r, ",") {
				part, _, _ = strings.Cut(part, "/")
				if _, bad := namesAmbiguous[strings.ToLower(part)]; bad {
					found = append(found, strings.ToLower(part))
				}
			}
		}
	}
	return found
}

// namesResourceArg returns the resource argument of a kubectl command's
// words (those after kubectl): the first word after a resource verb that
// is neither a flag nor a flag's value.
func namesResourceArg(cmd []string) (string, bool) {
	verb := false
	for j := 0; j < len(cmd); j++ {
		a := cmd[j]
		if strings.HasPrefix(a, "-") {
			if namesValueFlags[a] {
				j++
			}
			continue
		}
		if !verb {
			if !namesResourceVerbs[a] {
				return "", false
			}
			verb = true
			continue
		}
		return a, true
	}
	return "", false
}

// namesUserFacingFiles lists the files whose commands users copy: the
// README, docs/, every README under deploy/, the chart's notes, the shell
// scripts under hack/ and the Go sources of cmd/ (hints the binaries
// print).
func namesUserFacingFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md", "deploy/chart/vmipam/templates/NOTES.txt"}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		files = append(files, filepath.ToSlash(strings.TrimPrefix(d, root+string(filepath.Separator))))
	}
	walk := func(dir string, match func(name string) bool) {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && match(d.Name()) {
				rel, err := filepath.Rel(root, p)
				if err != nil {
					return err
				}
				files = append(files, filepath.ToSlash(rel))
			}
			return nil
		})
		if err != nil {
			t.Fatalf("walk %s: %v", dir, err)
		}
	}
	walk("deploy", func(n string) bool { return n == "README.md" })
	walk("hack", func(n string) bool { return strings.HasSuffix(n, ".sh") })
	walk("cmd", func(n string) bool { return strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") })
	return files
}

// TestNoAmbiguousCommands scans what users read and copy (the README,
// docs/, deploy's READMEs, the chart's notes, hack's scripts and the hints
// cmd/ prints) for kubectl commands naming a resource that a cluster with
// KubeVirt, NeonVM or Calico resolves to another project's kind (kubectl
// get vm, get virtualmachines, get ippools, ...), and fails naming the
// file, the line and the name to write instead.
func TestNoAmbiguousCommands(t *testing.T) {
	files := namesUserFacingFiles(t)
	if len(files) < 6 {
		t.Fatalf("found only %v to scan", files)
	}
	for _, f := range files {
		fh, err := os.Open(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for n := 1; sc.Scan(); n++ {
			for _, name := range namesAmbiguousCommands(sc.Text(), strings.HasSuffix(f, ".sh")) {
				t.Errorf("%s:%d: %q names %s, which is another project's in a cluster with KubeVirt, NeonVM or Calico: write %s, or the category vmipam",
					f, n, strings.TrimSpace(sc.Text()), name, namesAmbiguous[name])
			}
		}
		if err := sc.Err(); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		_ = fh.Close()
	}
}

// TestNamesScanner checks the scanner of TestNoAmbiguousCommands on lines
// it must flag and lines it must leave alone: a scanner that finds nothing
// would let the documentation drift.
func TestNamesScanner(t *testing.T) {
	tests := []struct {
		line  string
		shell bool
		want  []string
	}{
		{"kubectl get vm -A", false, []string{"vm"}},
		{"`kubectl get vm db-2 -o yaml` prints", false, []string{"vm"}},
		{"prints `kubectl get vm` and `kubectl get ippools`, then", false, []string{"vm", "ippools"}},
		{"kubectl --kubeconfig .local/kubeconfig get vm -A", false, []string{"vm"}},
		{"hack/e2e/cluster.sh exec kubectl get vm -A", false, []string{"vm"}},
		{"(`kubectl get ippool <pool> -o yaml`: `status.counts`,", false, []string{"ippool"}},
		{"kubectl -n default describe virtualmachines/db-1", false, []string{"virtualmachines"}},
		{"kubectl get ippools.vmipam.io,vm", false, []string{"vm"}},
		{"\tk get ippools -o jsonpath='{.items[0].status.allocated}'", true, []string{"ippools"}},
		{`log "kubeconfig: $kubeconfig  (try: $kubectl --kubeconfig $kubeconfig get vm -A)"`, true, []string{"vm"}},
		{`fmt.Println("kubectl get vms")`, false, []string{"vms"}},
		{"kubectl delete ipp default", false, []string{"ipp"}},
		{"kubectl get virtualmachines.vmipam.io -A", false, nil},
		{"kubectl get ippools.vmipam.io", false, nil},
		{"kubectl get vmivm,vmipool -A", false, nil},
		{"kubectl get vmipam -A", false, nil},
		{"kubectl -n vmipam-system rollout status deployment/vmipam", false, nil},
		{"kubectl apply -f vm.yaml", false, nil},
		{"kubectl get events -n vm", false, nil},
		{"k get vm", false, nil},
		{"the vm gets an address; ippools hold ranges", false, nil},
		{"kubectl vmipam who 10.0.0.5", false, nil},
	}
	for _, tc := range tests {
		t.Run(tc.line, func(t *testing.T) {
			if got := namesAmbiguousCommands(tc.line, tc.shell); !slices.Equal(got, tc.want) {
				t.Errorf("namesAmbiguousCommands(%q) = %q, want %q", tc.line, got, tc.want)
			}
		})
	}
}

// namesNeonVMConfig is the kinds configuration of the installs without
// vmipam's VirtualMachine: NeonVM's kind alone.
const namesNeonVMConfig = "deploy/kinds/examples/neonvm.yaml"

// namesWithoutVM prepares an install that serves NeonVM's VirtualMachine
// only and leaves vmipam's reference CRD out, both ways: a copy of deploy/
// whose kinds.yaml is NeonVM's and whose wiring.yaml is rendered from it (as
// `make manifests` would), with an overlay of overlays/default and the
// component without-virtualmachine; and the chart's arguments for the
// same (crds.virtualMachine=false, the configuration and its wiring for
// namespace ns). It returns the overlay's absolute path and the arguments.
func namesWithoutVM(t *testing.T, ns string) (string, []string) {
	t.Helper()
	tmp := t.TempDir()
	if err := os.CopyFS(filepath.Join(tmp, "deploy"), os.DirFS(filepath.Join(root, "deploy"))); err != nil {
		t.Fatalf("copy deploy/: %v", err)
	}
	config, err := os.ReadFile(filepath.Join(root, namesNeonVMConfig))
	if err != nil {
		t.Fatal(err)
	}
	ks, err := kinds.Parse(config)
	if err != nil {
		t.Fatalf("%s: %v", namesNeonVMConfig, err)
	}
	wiring := func(ns string) []byte {
		b, err := manifests.YAML(manifests.All(ks, manifests.Options{Namespace: ns}), "Rendered by test/deploy from "+namesNeonVMConfig+".")
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	overlay := filepath.Join(tmp, "deploy", "my-vmipam")
	for f, b := range map[string][]byte{
		filepath.Join(tmp, "deploy", "kinds", "kinds.yaml"):  config,
		filepath.Join(tmp, "deploy", "kinds", "wiring.yaml"): wiring(namespace),
		filepath.Join(tmp, "chart-wiring.yaml"):              wiring(ns),
		filepath.Join(overlay, "kustomization.yaml"): []byte("resources:\n- ../overlays/default\n" +
			"components:\n- ../components/without-virtualmachine\n"),
	} {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return overlay, []string{"--set", "crds.virtualMachine=false",
		"--set-file", "kinds.config=" + filepath.Join(root, namesNeonVMConfig),
		"--set-file", "kinds.wiring=" + filepath.Join(tmp, "chart-wiring.yaml")}
}

// namesServesVM reports whether o grants or matches vmipam.io's
// virtualmachines anywhere: an RBAC rule, a webhook rule, an admission
// policy's resource rule.
func namesServesVM(v any) bool {
	switch v := v.(type) {
	case map[string]any:
		groups, _ := v["apiGroups"].([]any)
		resources, _ := v["resources"].([]any)
		if slices.Contains(groups, any("vmipam.io")) && slices.Contains(resources, any("virtualmachines")) {
			return true
		}
		for _, e := range v {
			if namesServesVM(e) {
				return true
			}
		}
	case []any:
		for _, e := range v {
			if namesServesVM(e) {
				return true
			}
		}
	}
	return false
}

// namesCheckWithoutVM checks a render of an install without vmipam's
// VirtualMachine (withVM false) or of the default one (true): the CRD
// virtualmachines.vmipam.io, and wiring for it, are there exactly when
// they should be; vmipam's other CRDs always are.
func namesCheckWithoutVM(t *testing.T, r *rendered, withVM bool) {
	t.Helper()
	crds := map[string]bool{}
	for _, o := range r.ofKind("CustomResourceDefinition") {
		crds[o.GetName()] = true
	}
	for _, name := range []string{"ippools.vmipam.io", "ipblocks.vmipam.io", "ipblockshares.vmipam.io", "iphistories.vmipam.io", "ipreleases.vmipam.io"} {
		if !crds[name] {
			t.Errorf("%s: no CRD %s", r.dir, name)
		}
	}
	if crds["virtualmachines.vmipam.io"] != withVM {
		t.Errorf("%s: CRD virtualmachines.vmipam.io rendered: %t, want %t", r.dir, crds["virtualmachines.vmipam.io"], withVM)
	}
	served := false
	for _, o := range r.objs {
		if o.GetKind() != "CustomResourceDefinition" && namesServesVM(o.Object) {
			served = true
			if !withVM {
				t.Errorf("%s: %s %s still names vmipam.io virtualmachines", r.dir, o.GetKind(), o.GetName())
			}
		}
	}
	if withVM && !served {
		t.Errorf("%s: nothing wires vmipam.io virtualmachines", r.dir)
	}
}

// namesStandIns are stand-ins of peers' CRDs (their names only, any
// content), installed beside vmipam's to see what kubectl resolves.
var namesStandIns = []struct{ group, kind, plural, singular, scope string }{
	{"kubevirt.io", "VirtualMachine", "virtualmachines", "virtualmachine", "Namespaced"},
	{"vm.neon.tech", "VirtualMachine", "virtualmachines", "neonvm", "Namespaced"},
	{"crd.projectcalico.org", "IPPool", "ippools", "ippool", "Cluster"},
}

// TestNamesInCluster installs stand-ins of KubeVirt's and NeonVM's
// VirtualMachine and Calico's IPPool beside vmipam's CRDs, with an object
// of each, and checks what kubectl lists: vmipam's short names and its
// category list vmipam's objects only (the category its VMs and pools, not
// its blocks), while the bare `vm` lists KubeVirt's, the ambiguity the
// documentation avoids.
func TestNamesInCluster(t *testing.T) {
	harness.NeedControlPlane(t)
	ctx := t.Context()
	var objs []*unstructured.Unstructured
	var crds []string
	for _, s := range namesStandIns {
		names := map[string]any{"kind": s.kind, "plural": s.plural, "singular": s.singular}
		if s.group == "kubevirt.io" {
			names["shortNames"] = []any{"vm", "vms"}
		}
		name := s.plural + "." + s.group
		crds = append(crds, "crd/"+name)
		objs = append(objs, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
			"metadata": map[string]any{"name": name},
			"spec": map[string]any{"group": s.group, "names": names, "scope": s.scope, "versions": []any{map[string]any{
				"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
			}}},
		}})
	}
	t.Cleanup(func() {
		if _, stderr, err := kubectl(context.WithoutCancel(ctx), nil, append([]string{"delete", "--ignore-not-found", "--wait=false"}, crds...)...); err != nil {
			t.Errorf("delete the stand-in CRDs: %v: %s", err, stderr)
		}
	})
	if _, stderr, err := apply(ctx, objs, false); err != nil {
		t.Fatalf("apply the stand-in CRDs: %v: %s", err, stderr)
	}
	if _, stderr, err := kubectl(ctx, nil, append([]string{"wait", "--for=condition=Established", "--timeout=30s"}, crds...)...); err != nil {
		t.Fatalf("wait for the stand-in CRDs: %v: %s", err, stderr)
	}
	manifest := `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: names-kubevirt, namespace: default}
---
apiVersion: vm.neon.tech/v1
kind: VirtualMachine
metadata: {name: names-neonvm, namespace: default}
---
apiVersion: crd.projectcalico.org/v1
kind: IPPool
metadata: {name: names-calico}
---
apiVersion: vmipam.io/v1alpha1
kind: IPPool
metadata: {name: names-vmipam}
spec:
  ranges:
  - cidr: 10.250.0.0/24
---
apiVersion: vmipam.io/v1alpha1
kind: VirtualMachine
metadata: {name: names-vmipam, namespace: default}
spec: {ipPool: names-vmipam}
`
	t.Cleanup(func() {
		if _, stderr, err := kubectl(context.WithoutCancel(ctx), []byte(manifest), "delete", "--ignore-not-found", "-f", "-"); err != nil {
			t.Errorf("delete the test's objects: %v: %s", err, stderr)
		}
	})
	if out, stderr, err := kubectl(ctx, []byte(manifest), "create", "-f", "-"); err != nil {
		t.Fatalf("create the test's objects: %v\n%s%s", err, out, stderr)
	}
	// kubectl caches discovery, from before the stand-ins here: each get
	// starts without a cache, as a user's kubectl after the installs.
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, kubectlPath, append(args, "--kubeconfig="+kubeconfig, "--cache-dir="+t.TempDir())...)
		cmd.Env = append(os.Environ(), "KUBECONFIG=")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("kubectl %s: %v", strings.Join(args, " "), err)
		}
		return string(out)
	}
	get := func(args ...string) []string {
		t.Helper()
		return strings.Fields(run(append([]string{"get", "-o", "name"}, args...)...))
	}
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"vmipam", "-A"}, []string{"ippool.vmipam.io/names-vmipam", "virtualmachine.vmipam.io/names-vmipam"}},
		{[]string{"vmivm", "-A"}, []string{"virtualmachine.vmipam.io/names-vmipam"}},
		{[]string{"vmipool"}, []string{"ippool.vmipam.io/names-vmipam"}},
		{[]string{"virtualmachines.vmipam.io", "-A"}, []string{"virtualmachine.vmipam.io/names-vmipam"}},
		{[]string{"ippools.vmipam.io"}, []string{"ippool.vmipam.io/names-vmipam"}},
		// The bare names: another project's objects, not vmipam's.
		{[]string{"vm", "-A"}, []string{"virtualmachine.kubevirt.io/names-kubevirt"}},
	}
	for _, tc := range tests {
		got := get(tc.args...)
		// Objects other tests left are no concern here; the test's own and
		// the other projects' are.
		got = slices.DeleteFunc(got, func(s string) bool { return !strings.Contains(s, "/names-") })
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("kubectl get %s lists %v, want %v", strings.Join(tc.args, " "), got, tc.want)
		}
	}
	// What an operator sees: the category's default output.
	out := run("get", "vmipam", "-A")
	if strings.Contains(out, "ipblock") {
		t.Errorf("kubectl get vmipam -A lists blocks:\n%s", out)
	}
	t.Logf("kubectl get vmipam -A:\n%s", out)
}
