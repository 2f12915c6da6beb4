// Command image builds vmipam's container image without a container
// engine: a static binary per platform, each in one layer with the files a
// non-root process needs, assembled into one OCI image index, written as
// an OCI image layout and as an OCI archive (which `ctr images import`,
// `podman load` and `skopeo copy oci-archive:` read), with an SPDX SBOM of
// the Go modules beside it.
//
// The same source gives the same digest: the binaries are built with
// -trimpath and no build ID, every timestamp is the commit's
// (SOURCE_DATE_EPOCH when set), and the tar and gzip streams and the JSON
// are written in a fixed order with no host details.
//
//	go run ./hack/image [-version v] [-platforms linux/amd64,linux/arm64] [-out bin/image]
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Media types of the OCI image specification.
const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
)

// nonroot is the user the image runs as, as distroless's nonroot.
const nonroot = 65532

// binary is the name of the image's one program, /<name> in its root: the
// main package's folder name (vmipam for ./cmd/vmipam).
func (o options) binary() string { return filepath.Base(filepath.Clean(o.pkg)) }

type options struct {
	repo, pkg, out, name, version, revision string
	platforms                               []string
	epoch                                   time.Time
}

func main() {
	var o options
	var platforms string
	flag.StringVar(&o.repo, "repo", ".", "The vmipam repository to build.")
	flag.StringVar(&o.pkg, "pkg", "./cmd/vmipam", "The main package to build, relative to -repo.")
	flag.StringVar(&o.out, "out", "bin/image", "Folder for the OCI layout, the OCI archive and the SBOM.")
	flag.StringVar(&o.name, "name", "ghcr.io/vmipam/vmipam", "The image's repository, which the archive names it by.")
	flag.StringVar(&o.version, "version", "", "The image's tag; empty: the chart's appVersion.")
	flag.StringVar(&platforms, "platforms", "linux/amd64,linux/arm64", "Comma-separated os/arch pairs.")
	flag.Parse()
	o.platforms = strings.Split(platforms, ",")
	if err := o.defaults(); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	res, err := build(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	fmt.Printf("%s:%s %s\n", o.name, o.version, res.index)
	for _, m := range res.manifests {
		fmt.Printf("  %s %s\n", m.platform, m.digest)
	}
	fmt.Printf("layout %s\narchive %s\nsbom %s\n", res.layout, res.archive, res.sbom)
}

// defaults fills the version from the chart, and the revision and the
// epoch from git (SOURCE_DATE_EPOCH first) when they are not set.
func (o *options) defaults() error {
	if o.version == "" {
		chart, err := os.ReadFile(filepath.Join(o.repo, "deploy", "chart", "vmipam", "Chart.yaml"))
		if err != nil {
			return fmt.Errorf("read the chart's appVersion: %w", err)
		}
		for line := range strings.Lines(string(chart)) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "appVersion:"); ok {
				o.version = strings.Trim(strings.TrimSpace(v), `"'`)
			}
		}
		if o.version == "" {
			return errors.New("the chart has no appVersion: pass -version")
		}
	}
	if o.revision == "" {
		if out, err := exec.Command("git", "-C", o.repo, "rev-parse", "HEAD").Output(); err == nil {
			o.revision = strings.TrimSpace(string(out))
		}
	}
	if !o.epoch.IsZero() {
		return nil
	}
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		if out, err := exec.Command("git", "-C", o.repo, "log", "-1", "--format=%ct").Output(); err == nil {
			s = strings.TrimSpace(string(out))
		}
	}
	if s == "" {
		s = "0"
	}
	secs, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return fmt.Errorf("SOURCE_DATE_EPOCH=%q: %w", s, err)
	}
	o.epoch = time.Unix(secs, 0).UTC()
	return nil
}

// result is what build wrote.
type result struct {
	index                 string
	manifests             []platformManifest
	layout, archive, sbom string
}

type platformManifest struct{ platform, digest string }

// descriptor is an OCI content descriptor.
type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// blobs collects the content of an OCI layout by digest.
type blobs map[string][]byte

func (b blobs) add(mediaType string, data []byte) descriptor {
	sum := sha256.Sum256(data)
	d := "sha256:" + hex.EncodeToString(sum[:])
	b[d] = data
	return descriptor{MediaType: mediaType, Digest: d, Size: int64(len(data))}
}

func (b blobs) addJSON(mediaType string, v any) (descriptor, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return descriptor{}, err
	}
	return b.add(mediaType, data), nil
}

// build builds the binaries and writes the image and the SBOM into o.out.
func build(o options) (result, error) {
	tmp, err := os.MkdirTemp("", "vmipam-image-")
	if err != nil {
		return result{}, err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	content := blobs{}
	labels := map[string]string{
		"org.opencontainers.image.title":    o.binary(),
		"org.opencontainers.image.version":  o.version,
		"org.opencontainers.image.source":   "https://github.com/vmipam/vmipam",
		"org.opencontainers.image.licenses": "Apache-2.0",
		"org.opencontainers.image.created":  o.epoch.Format(time.RFC3339),
	}
	if o.revision != "" {
		labels["org.opencontainers.image.revision"] = o.revision
	}
	var res result
	var index struct {
		SchemaVersion int               `json:"schemaVersion"`
		MediaType     string            `json:"mediaType"`
		Manifests     []descriptor      `json:"manifests"`
		Annotations   map[string]string `json:"annotations,omitempty"`
	}
	index.SchemaVersion, index.MediaType = 2, mediaIndex
	var sbomFrom string
	for _, pl := range o.platforms {
		goos, goarch, ok := strings.Cut(strings.TrimSpace(pl), "/")
		if !ok || goos != "linux" {
			return result{}, fmt.Errorf("platform %q: want linux/<arch>", pl)
		}
		bin := filepath.Join(tmp, goarch, o.binary())
		if err := goBuild(o, goarch, bin); err != nil {
			return result{}, err
		}
		if sbomFrom == "" {
			sbomFrom = bin
		}
		layer, diffID, err := layerOf(bin, o.epoch)
		if err != nil {
			return result{}, err
		}
		layerDesc := content.add(mediaLayer, layer)
		config := map[string]any{
			"architecture": goarch,
			"os":           goos,
			"created":      o.epoch.Format(time.RFC3339),
			"config": map[string]any{
				"User":       fmt.Sprintf("%d:%d", nonroot, nonroot),
				"Entrypoint": []string{"/" + o.binary()},
				"WorkingDir": "/",
				"Env":        []string{"PATH=/"},
				"Labels":     labels,
			},
			"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{diffID}},
			"history": []map[string]string{{"created": o.epoch.Format(time.RFC3339), "created_by": "go run ./hack/image"}},
		}
		configDesc, err := content.addJSON(mediaConfig, config)
		if err != nil {
			return result{}, err
		}
		manifest := map[string]any{
			"schemaVersion": 2,
			"mediaType":     mediaManifest,
			"config":        configDesc,
			"layers":        []descriptor{layerDesc},
			"annotations":   labels,
		}
		md, err := content.addJSON(mediaManifest, manifest)
		if err != nil {
			return result{}, err
		}
		md.Platform = &platform{Architecture: goarch, OS: goos}
		index.Manifests = append(index.Manifests, md)
		res.manifests = append(res.manifests, platformManifest{platform: goos + "/" + goarch, digest: md.Digest})
	}
	index.Annotations = labels
	indexDesc, err := content.addJSON(mediaIndex, index)
	if err != nil {
		return result{}, err
	}
	res.index = indexDesc.Digest
	// The layout's own index.json points at the image index and names it,
	// for the tools that import an archive.
	ref := o.name + ":" + o.version
	indexDesc.Annotations = map[string]string{
		"org.opencontainers.image.ref.name": o.version,
		"io.containerd.image.name":          ref,
	}
	top, err := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": mediaIndex, "manifests": []descriptor{indexDesc}})
	if err != nil {
		return result{}, err
	}
	files := map[string][]byte{
		"oci-layout": []byte(`{"imageLayoutVersion":"1.0.0"}`),
		"index.json": top,
	}
	for d, data := range content {
		files["blobs/sha256/"+strings.TrimPrefix(d, "sha256:")] = data
	}
	base := "vmipam-" + o.version
	res.layout = filepath.Join(o.out, base)
	res.archive = filepath.Join(o.out, base+".oci.tar")
	res.sbom = filepath.Join(o.out, base+".spdx.json")
	if err := os.RemoveAll(res.layout); err != nil {
		return result{}, err
	}
	for name, data := range files {
		p := filepath.Join(res.layout, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return result{}, err
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return result{}, err
		}
	}
	archive, err := archiveOf(files, o.epoch)
	if err != nil {
		return result{}, err
	}
	if err := os.WriteFile(res.archive, archive, 0o644); err != nil {
		return result{}, err
	}
	sbom, err := sbomOf(sbomFrom, ref, res.index, o)
	if err != nil {
		return result{}, err
	}
	return res, os.WriteFile(res.sbom, sbom, 0o644)
}

// goBuild builds o.pkg for linux/goarch into out: static, without paths of
// this machine or a build ID.
func goBuild(o options, goarch, out string) error {
	goBin := os.Getenv("GO")
	if goBin == "" {
		goBin = "go"
	}
	cmd := exec.Command(goBin, "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid=", "-o", out, o.pkg)
	cmd.Dir = o.repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch, "GOFLAGS=-mod=readonly")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build %s for linux/%s: %w", o.pkg, goarch, err)
	}
	return nil
}

// layerOf returns the gzipped layer holding the binary as /<its name>, the
// user and group the image runs as, and /tmp, and the layer's diff ID (the
// digest of the tar before compression).
func layerOf(bin string, epoch time.Time) ([]byte, string, error) {
	name := filepath.Base(bin)
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, "", err
	}
	entries := []struct {
		name string
		mode int64
		data []byte
		dir  bool
	}{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/group", mode: 0o644, data: fmt.Appendf(nil, "root:x:0:\nnonroot:x:%d:\n", nonroot)},
		{name: "etc/passwd", mode: 0o644, data: fmt.Appendf(nil, "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", nonroot, nonroot)},
		{name: "home/", mode: 0o755, dir: true},
		{name: "home/nonroot/", mode: 0o700, dir: true},
		{name: "tmp/", mode: 0o1777, dir: true},
		{name: name, mode: 0o755, data: data},
	}
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, ModTime: epoch, Format: tar.FormatPAX}
		if e.name == "home/nonroot/" {
			h.Uid, h.Gid = nonroot, nonroot
		}
		if e.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, "", err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, "", err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, "", err
	}
	sum := sha256.Sum256(raw.Bytes())
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return nil, "", err
	}
	if _, err := io.Copy(zw, &raw); err != nil {
		return nil, "", err
	}
	if err := zw.Close(); err != nil {
		return nil, "", err
	}
	return gz.Bytes(), "sha256:" + hex.EncodeToString(sum[:]), nil
}

// archiveOf tars an OCI layout's files in name order.
func archiveOf(files map[string][]byte, epoch time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	names := slices.Sorted(maps.Keys(files))
	dirs := map[string]bool{}
	for _, name := range names {
		for d := filepath.Dir(name); d != "."; d = filepath.Dir(d) {
			dirs[d+"/"] = true
		}
	}
	for _, d := range slices.Sorted(maps.Keys(dirs)) {
		if err := tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	for _, name := range names {
		data := files[name]
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// sbomOf returns an SPDX 2.3 document of the Go modules built into bin,
// and of the Go toolchain, describing the image ref at digest.
func sbomOf(bin, ref, digest string, o options) ([]byte, error) {
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("read the modules of %s: %w", bin, err)
	}
	type extRef struct {
		Category string `json:"referenceCategory"`
		Type     string `json:"referenceType"`
		Locator  string `json:"referenceLocator"`
	}
	type pkg struct {
		SPDXID           string   `json:"SPDXID"`
		Name             string   `json:"name"`
		Version          string   `json:"versionInfo,omitempty"`
		Download         string   `json:"downloadLocation"`
		FilesAnalyzed    bool     `json:"filesAnalyzed"`
		Comment          string   `json:"comment,omitempty"`
		ExternalRefs     []extRef `json:"externalRefs,omitempty"`
		PrimaryPurpose   string   `json:"primaryPackagePurpose,omitempty"`
		LicenseConcluded string   `json:"licenseConcluded"`
	}
	type rel struct {
		Element string `json:"spdxElementId"`
		Type    string `json:"relationshipType"`
		Related string `json:"relatedSpdxElement"`
	}
	id := func(path string) string {
		return "SPDXRef-Package-" + strings.NewReplacer("/", "-", ".", "-", "_", "-", "~", "-").Replace(path)
	}
	image := pkg{SPDXID: "SPDXRef-Image", Name: ref, Version: o.version, Download: "NOASSERTION", PrimaryPurpose: "CONTAINER",
		LicenseConcluded: "NOASSERTION", Comment: "OCI image index " + digest,
		ExternalRefs: []extRef{{Category: "PACKAGE-MANAGER", Type: "purl", Locator: "pkg:oci/vmipam@" + strings.ReplaceAll(digest, ":", "%3A")}}}
	pkgs := []pkg{image}
	rels := []rel{{Element: "SPDXRef-DOCUMENT", Type: "DESCRIBES", Related: image.SPDXID}}
	add := func(path, version, sum string) {
		p := pkg{SPDXID: id(path), Name: path, Version: version, Download: "NOASSERTION", LicenseConcluded: "NOASSERTION", PrimaryPurpose: "LIBRARY",
			ExternalRefs: []extRef{{Category: "PACKAGE-MANAGER", Type: "purl", Locator: "pkg:golang/" + path + "@" + version}}}
		if sum != "" {
			p.Comment = "go.sum " + sum
		}
		pkgs = append(pkgs, p)
		rels = append(rels, rel{Element: image.SPDXID, Type: "CONTAINS", Related: p.SPDXID})
	}
	version := info.Main.Version
	if version == "" || version == "(devel)" {
		version = o.version
	}
	add(info.Main.Path, version, info.Main.Sum)
	add("stdlib", strings.TrimPrefix(info.GoVersion, "go"), "")
	for _, d := range info.Deps {
		if d.Replace != nil {
			d = d.Replace
		}
		add(d.Path, d.Version, d.Sum)
	}
	doc := map[string]any{
		"spdxVersion":       "SPDX-2.3",
		"dataLicense":       "CC0-1.0",
		"SPDXID":            "SPDXRef-DOCUMENT",
		"name":              ref,
		"documentNamespace": "https://vmipam.io/spdx/" + o.version + "/" + strings.TrimPrefix(digest, "sha256:"),
		"creationInfo":      map[string]any{"created": o.epoch.Format(time.RFC3339), "creators": []string{"Tool: vmipam hack/image"}},
		"packages":          pkgs,
		"relationships":     rels,
	}
	return json.MarshalIndent(doc, "", "  ")
}
