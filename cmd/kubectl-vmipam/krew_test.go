package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"text/template"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/version"
	"sigs.k8s.io/yaml"
)

// krewManifest is the plugin manifest as krew reads it (krew's
// index.Plugin, v1alpha2).
type krewManifest struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version          string         `json:"version"`
		ShortDescription string         `json:"shortDescription"`
		Description      string         `json:"description,omitempty"`
		Caveats          string         `json:"caveats,omitempty"`
		Homepage         string         `json:"homepage,omitempty"`
		Platforms        []krewPlatform `json:"platforms"`
	} `json:"spec"`
}

type krewPlatform struct {
	Selector *metav1.LabelSelector `json:"selector"`
	URI      string                `json:"uri"`
	Sha256   string                `json:"sha256"`
	Files    []krewFile            `json:"files,omitempty"`
	Bin      string                `json:"bin"`
}

type krewFile struct {
	From string `json:"from"`
	To   string `json:"to"`
}

var (
	krewName   = regexp.MustCompile(`^[\w-]+$`)
	krewSHA256 = regexp.MustCompile(`^[a-f0-9]{64}$`)
	// krewSemver is krew's version form: a leading v, then semver.
	krewSemver = regexp.MustCompile(`^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)
	// windowsReserved are names Windows refuses for a file, which krew
	// refuses for a plugin.
	windowsReserved = []string{"CON", "PRN", "AUX", "NUL", "COM1", "COM2", "COM3", "COM4", "COM5", "COM6", "COM7", "COM8", "COM9",
		"LPT1", "LPT2", "LPT3", "LPT4", "LPT5", "LPT6", "LPT7", "LPT8", "LPT9"}
	// krewOS and krewArch are the values krew matches a platform's
	// selector against (Go's GOOS and GOARCH).
	krewOS   = map[string]bool{"linux": true, "darwin": true, "windows": true, "freebsd": true}
	krewArch = map[string]bool{"amd64": true, "arm64": true, "386": true, "arm": true, "ppc64le": true, "s390x": true}
)

// validateKrew applies to a manifest read from file the checks krew makes
// before it installs a plugin (ValidatePlugin) and those krew-index makes
// of a submission.
func validateKrew(file string, raw []byte) error {
	var m krewManifest
	if err := yaml.UnmarshalStrict(raw, &m); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	name := m.Metadata.Name
	switch {
	case m.APIVersion != "krew.googlecontainertools.github.com/v1alpha2":
		return fmt.Errorf("apiVersion %q: krew supports krew.googlecontainertools.github.com/v1alpha2", m.APIVersion)
	case m.Kind != "Plugin":
		return fmt.Errorf("kind %q: want Plugin", m.Kind)
	case !krewName.MatchString(name) || slicesContainsFold(windowsReserved, name):
		return fmt.Errorf("metadata.name %q: must match %s and not be a name Windows reserves", name, krewName)
	case strings.TrimSuffix(filepath.Base(file), ".yaml") != name:
		return fmt.Errorf("file %s: krew-index wants it named %s.yaml, after the plugin", filepath.Base(file), name)
	case m.Spec.ShortDescription == "":
		return errors.New("spec.shortDescription is required")
	case strings.ContainsAny(m.Spec.ShortDescription, "\r\n"):
		return errors.New("spec.shortDescription has a line break")
	case len(m.Spec.Platforms) == 0:
		return errors.New("spec.platforms is empty")
	case !krewSemver.MatchString(m.Spec.Version):
		return fmt.Errorf("spec.version %q: want a semantic version with a leading v, such as v0.4.0", m.Spec.Version)
	}
	if _, err := version.ParseSemantic(strings.TrimPrefix(m.Spec.Version, "v")); err != nil {
		return fmt.Errorf("spec.version: %w", err)
	}
	seen := map[string]int{}
	for i, p := range m.Spec.Platforms {
		if err := validateKrewPlatform(p, "kubectl-"+name); err != nil {
			return fmt.Errorf("spec.platforms[%d]: %w", i, err)
		}
		key := p.Selector.MatchLabels["os"] + "/" + p.Selector.MatchLabels["arch"]
		if j, dup := seen[key]; dup {
			return fmt.Errorf("spec.platforms[%d]: selects %s, as platforms[%d] does", i, key, j)
		}
		seen[key] = i
	}
	return nil
}

func validateKrewPlatform(p krewPlatform, bin string) error {
	u, err := url.Parse(p.URI)
	switch {
	case p.URI == "":
		return errors.New("uri is required")
	case err != nil || u.Scheme != "https" || u.Host == "":
		return fmt.Errorf("uri %q: want an https URL", p.URI)
	case p.Sha256 == "":
		return errors.New("sha256 is required")
	case !krewSHA256.MatchString(p.Sha256):
		return fmt.Errorf("sha256 %q: must match %s", p.Sha256, krewSHA256)
	case p.Bin == "":
		return errors.New("bin is required")
	case p.Files != nil && len(p.Files) == 0:
		return errors.New("files: leave it out or list at least one")
	}
	for j, f := range p.Files {
		if f.From == "" || f.To == "" {
			return fmt.Errorf("files[%d]: from and to are required", j)
		}
	}
	sel := p.Selector
	switch {
	case sel == nil:
		return errors.New("selector is required")
	case sel.MatchLabels == nil && len(sel.MatchExpressions) == 0:
		return errors.New("selector is empty")
	case sel.MatchLabels != nil && len(sel.MatchLabels) == 0:
		return errors.New("selector.matchLabels is given but empty")
	case sel.MatchExpressions != nil && len(sel.MatchExpressions) == 0:
		return errors.New("selector.matchExpressions is given but empty")
	}
	for k, v := range sel.MatchLabels {
		switch {
		case k == "os" && krewOS[v], k == "arch" && krewArch[v]:
		case k != "os" && k != "arch":
			return fmt.Errorf("selector key %q: krew matches only os and arch", k)
		default:
			return fmt.Errorf("selector %s=%q: not a value krew matches (GOOS, GOARCH)", k, v)
		}
	}
	for _, e := range sel.MatchExpressions {
		if e.Key != "os" && e.Key != "arch" {
			return fmt.Errorf("selector key %q: krew matches only os and arch", e.Key)
		}
	}
	if sel.MatchLabels["os"] == "windows" {
		bin += ".exe"
	}
	if filepath.Base(p.Bin) != bin {
		return fmt.Errorf("bin %q: want %s, the name kubectl finds the plugin by", p.Bin, bin)
	}
	return nil
}

func slicesContainsFold(list []string, s string) bool {
	for _, x := range list {
		if strings.EqualFold(x, s) {
			return true
		}
	}
	return false
}

// renderKrew renders the manifest template as a release does, with
// version and a checksum per platform (the sha256 of the platform's
// name: the test cannot have the archives).
func renderKrew(t *testing.T, raw []byte, version string) []byte {
	t.Helper()
	sums := map[string]string{}
	for _, p := range []string{"linux/amd64", "linux/arm64", "darwin/amd64", "darwin/arm64", "windows/amd64"} {
		h := sha256.Sum256([]byte(p))
		sums[p] = hex.EncodeToString(h[:])
	}
	tmpl, err := template.New("krew").Option("missingkey=error").Parse(string(raw))
	if err != nil {
		t.Fatalf("parse the manifest template: %v", err)
	}
	var b bytes.Buffer
	if err := tmpl.Execute(&b, map[string]any{"Version": version, "SHA256": sums}); err != nil {
		t.Fatalf("render the manifest template: %v", err)
	}
	return b.Bytes()
}

// TestKrewManifest renders deploy/krew/vmipam.yaml and validates it as
// krew and krew-index do; then checks that the validation refuses what
// krew refuses.
func TestKrewManifest(t *testing.T) {
	file := filepath.Join("..", "..", "deploy", "krew", "vmipam.yaml")
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	good := renderKrew(t, raw, "v0.4.0")
	if err := validateKrew(file, good); err != nil {
		t.Fatalf("deploy/krew/vmipam.yaml: %v", err)
	}
	var m krewManifest
	if err := yaml.Unmarshal(good, &m); err != nil {
		t.Fatal(err)
	}
	for _, p := range m.Spec.Platforms {
		if !strings.Contains(p.URI, "/v0.4.0/") || !strings.HasSuffix(p.URI, "_"+p.Selector.MatchLabels["os"]+"_"+p.Selector.MatchLabels["arch"]+".tar.gz") {
			t.Errorf("uri %s does not name the release's archive of %v", p.URI, p.Selector.MatchLabels)
		}
	}

	// Each mutation must be refused, naming what is wrong.
	tests := map[string]struct {
		file    string
		version string
		edit    func(string) string
		wantErr string
	}{
		"version without v":    {version: "0.4.0", wantErr: "spec.version"},
		"version not semver":   {version: "v0.4", wantErr: "spec.version"},
		"file named otherwise": {file: "kubectl-vmipam.yaml", wantErr: "named vmipam.yaml"},
		"old apiVersion":       {edit: rep("v1alpha2", "v1alpha1"), wantErr: "apiVersion"},
		"name with a dot":      {file: "vm.ipam.yaml", edit: rep("name: vmipam", "name: vm.ipam"), wantErr: "metadata.name"},
		"reserved name":        {file: "con.yaml", edit: rep("name: vmipam", "name: con"), wantErr: "metadata.name"},
		"short description lines": {edit: func(s string) string {
			return regexp.MustCompile(`shortDescription: .*`).ReplaceAllString(s, `shortDescription: "two\nlines"`)
		}, wantErr: "line break"},
		"selector key":            {edit: rep("os: linux", "distro: linux"), wantErr: `selector key "distro"`},
		"unknown os":              {edit: rep("os: darwin", "os: macos"), wantErr: `os="macos"`},
		"windows bin without exe": {edit: rep("bin: kubectl-vmipam.exe", "bin: kubectl-vmipam"), wantErr: "kubectl-vmipam.exe"},
		"bin named otherwise":     {edit: repOnce("bin: kubectl-vmipam\n", "bin: vmipam\n"), wantErr: `bin "vmipam"`},
		"two platforms alike":     {edit: rep("arch: arm64", "arch: amd64"), wantErr: "as platforms"},
		"unknown field":           {edit: rep("homepage:", "website:"), wantErr: "decode"},
		"http uri":                {edit: rep("uri: https:", "uri: http:"), wantErr: "https URL"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			v := tt.version
			if v == "" {
				v = "v0.4.0"
			}
			out := string(renderKrew(t, raw, v))
			if tt.edit != nil {
				out = tt.edit(out)
			}
			f := file
			if tt.file != "" {
				f = tt.file
			}
			err := validateKrew(f, []byte(out))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("validateKrew = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
	// A checksum that is not 64 hex digits is refused.
	bad := strings.Replace(string(good), m.Spec.Platforms[0].Sha256, strings.ToUpper(m.Spec.Platforms[0].Sha256), 1)
	if err := validateKrew(file, []byte(bad)); err == nil || !strings.Contains(err.Error(), "sha256") {
		t.Errorf("upper-case sha256: validateKrew = %v, want a sha256 error", err)
	}
}

func rep(old, new string) func(string) string {
	return func(s string) string { return strings.ReplaceAll(s, old, new) }
}

func repOnce(old, new string) func(string) string {
	return func(s string) string { return strings.Replace(s, old, new, 1) }
}
