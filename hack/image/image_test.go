package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestImage builds an image of a small program for two platforms, twice,
// and reads it back as an image consumer would: the same source gives the
// same bytes; the layout names the image; each platform's manifest holds a
// static binary of its architecture named after its package (/hello here),
// run as the non-root user, with the config's diff ID matching the layer;
// and the SBOM lists the Go modules built in.
func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries for two platforms")
	}
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	o := options{repo: repo, pkg: "./hack/image/testdata/hello", name: "example.test/vmipam", version: "v0.0.0-test",
		platforms: []string{"linux/amd64", "linux/arm64"}, epoch: time.Unix(1700000000, 0).UTC(), revision: "0123abcd"}
	var results []result
	var archives [][]byte
	for range 2 {
		o.out = t.TempDir()
		res, err := build(o)
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(res.archive)
		if err != nil {
			t.Fatal(err)
		}
		results, archives = append(results, res), append(archives, data)
	}
	if results[0].index != results[1].index || !bytes.Equal(archives[0], archives[1]) {
		t.Fatalf("two builds of one source: index %s and %s, archives equal %v; want the same bytes",
			results[0].index, results[1].index, bytes.Equal(archives[0], archives[1]))
	}
	res := results[1]
	blob := func(digest string) []byte {
		t.Helper()
		data, err := os.ReadFile(filepath.Join(res.layout, "blobs", "sha256", strings.TrimPrefix(digest, "sha256:")))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		if "sha256:"+hex.EncodeToString(sum[:]) != digest {
			t.Fatalf("blob %s does not hash to its name", digest)
		}
		return data
	}
	type desc struct {
		MediaType, Digest string
		Platform          *struct{ Architecture, OS string }
		Annotations       map[string]string
	}
	var top struct{ Manifests []desc }
	data, err := os.ReadFile(filepath.Join(res.layout, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &top); err != nil || len(top.Manifests) != 1 {
		t.Fatalf("index.json %s: %v", data, err)
	}
	if got := top.Manifests[0].Annotations["io.containerd.image.name"]; got != "example.test/vmipam:v0.0.0-test" || top.Manifests[0].Digest != res.index {
		t.Errorf("index.json names %q at %s; want example.test/vmipam:v0.0.0-test at %s", got, top.Manifests[0].Digest, res.index)
	}
	var index struct{ Manifests []desc }
	if err := json.Unmarshal(blob(res.index), &index); err != nil {
		t.Fatal(err)
	}
	machines := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	var arches []string
	for _, m := range index.Manifests {
		if m.Platform == nil || m.Platform.OS != "linux" || m.MediaType != mediaManifest {
			t.Fatalf("index entry %+v: want a linux image manifest", m)
		}
		arch := m.Platform.Architecture
		arches = append(arches, arch)
		var man struct {
			Config desc
			Layers []desc
		}
		if err := json.Unmarshal(blob(m.Digest), &man); err != nil || len(man.Layers) != 1 {
			t.Fatalf("%s manifest: %v, %d layers", arch, err, len(man.Layers))
		}
		var cfg struct {
			Architecture, OS string
			Config           struct {
				User       string
				Entrypoint []string
			}
			RootFS struct {
				DiffIDs []string `json:"diff_ids"`
			}
		}
		if err := json.Unmarshal(blob(man.Config.Digest), &cfg); err != nil {
			t.Fatal(err)
		}
		if cfg.Architecture != arch || cfg.Config.User != "65532:65532" || !slices.Equal(cfg.Config.Entrypoint, []string{"/hello"}) {
			t.Errorf("%s config: %+v; want its architecture, user 65532:65532, entrypoint /hello", arch, cfg)
		}
		zr, err := gzip.NewReader(bytes.NewReader(blob(man.Layers[0].Digest)))
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(zr)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(raw)
		if len(cfg.RootFS.DiffIDs) != 1 || cfg.RootFS.DiffIDs[0] != "sha256:"+hex.EncodeToString(sum[:]) {
			t.Errorf("%s: diff IDs %v; want the layer's uncompressed digest", arch, cfg.RootFS.DiffIDs)
		}
		files := map[string]*tar.Header{}
		var bin []byte
		tr := tar.NewReader(bytes.NewReader(raw))
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name] = h
			if h.Name == "hello" {
				bin, _ = io.ReadAll(tr)
			}
		}
		if h := files["hello"]; h == nil || h.Mode != 0o755 || h.Uid != 0 {
			t.Fatalf("%s layer: /hello %+v; want an executable owned by root", arch, h)
		}
		if h := files["tmp/"]; h == nil || h.Mode != 0o1777 {
			t.Errorf("%s layer: /tmp %+v; want mode 1777", arch, h)
		}
		f, err := elf.NewFile(bytes.NewReader(bin))
		if err != nil {
			t.Fatal(err)
		}
		if f.Machine != machines[arch] {
			t.Errorf("%s layer: the binary is for %s", arch, f.Machine)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s layer: the binary is dynamically linked", arch)
			}
		}
	}
	if slices.Sort(arches); !slices.Equal(arches, []string{"amd64", "arm64"}) {
		t.Errorf("platforms %v; want amd64 and arm64", arches)
	}
	var sbom struct {
		SPDXVersion string `json:"spdxVersion"`
		Packages    []struct {
			Name, VersionInfo, Comment string
			ExternalRefs               []struct{ ReferenceLocator string }
		}
	}
	data, err = os.ReadFile(res.sbom)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &sbom); err != nil || sbom.SPDXVersion != "SPDX-2.3" {
		t.Fatalf("SBOM: %v, version %q", err, sbom.SPDXVersion)
	}
	var found []string
	for _, p := range sbom.Packages {
		switch {
		case p.Name == "k8s.io/utils" && len(p.ExternalRefs) == 1 && strings.HasPrefix(p.ExternalRefs[0].ReferenceLocator, "pkg:golang/k8s.io/utils@v"):
			found = append(found, "module")
		case p.Name == "stdlib" && p.VersionInfo != "":
			found = append(found, "stdlib")
		case strings.Contains(p.Comment, res.index):
			found = append(found, "image")
		}
	}
	if slices.Sort(found); !slices.Equal(found, []string{"image", "module", "stdlib"}) {
		t.Errorf("SBOM packages found %v; want the image (by its index digest), k8s.io/utils with its purl, and the standard library", found)
	}
}
