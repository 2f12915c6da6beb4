package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/certs/pki"
)

// The no-op mutating webhook: its configuration, its name (the API
// server's admission metrics label calls by it) and the annotation it
// adds.
const (
	noopConfig          = "e2ebench-noop"
	noopMutatingName    = "mnoop.e2ebench.vmipam.io"
	noopAnnotation      = "e2ebench.vmipam.io/noop"
	noopAnnotationValue = "true"
	noopMutatePath      = "/mutate"
	// noopMaxBody bounds an AdmissionReview, as the API server bounds a
	// request.
	noopMaxBody = 3 << 20
)

// noopServer is the HTTPS server behind the no-op mutating webhook: it
// decodes every AdmissionReview and allows it with a JSON patch that adds
// one annotation and a finalizer (noopFinalizer, which the bench's
// finalizerRemover takes away on deletion). It is the floor of what one
// mutating webhook call per create costs the API server (encoding the
// review, TLS on loopback, applying a patch), as vmipam's one call per
// create does, with almost no work of its own. It runs inside this
// program, so its CPU counts as e2ebench's, or with -noop-process in a
// process of its own (startNoopProcess), whose noopServer here only
// starts, reads and stops it.
type noopServer struct {
	srv      *http.Server
	url      string
	caBundle []byte
	// proc is the no-op process with -noop-process (nil otherwise), done
	// its exit, and status the base URL of its status server.
	proc   *exec.Cmd
	done   chan error
	status string
	// mutated counts the reviews answered.
	mutated atomic.Int64
	// The mutating handler's patches, fixed: patches[a][l] adds the
	// annotations to an existing map (a) or adds the map, and the labels
	// (with -noop-stamp; none otherwise) to an existing map (l) or adds it.
	patches [2][2][]byte
}

// noopStamp are the metadata the no-op webhook writes with -noop-stamp
// beside its own annotation (which stands in for vmipam's pool annotation)
// and its finalizer: with them the object carries as many annotations and
// labels as vmipam's stamp writes, about as long (the reservation token
// and the address annotations, the holder label), under keys of their
// own, so that neither vmipam's controller nor its admission policies read
// them. A floor whose stored objects are as large as vmipam's.
var noopStamp = struct{ annotations, labels map[string]string }{
	annotations: map[string]string{
		"noopbm.io/token":   "0123456789abcdef01234567", // 12 random bytes in hex, as vmipam's
		"noopbm.io/address": "100.64.0.1",
	},
	labels: map[string]string{"noopbm.io/holder": "slot-0"},
}

// startNoopServer issues a CA and a serving certificate for 127.0.0.1 and
// serves the no-op mutating webhook on a free loopback port, HTTP/1.1 only
// as vmipam serves its own. With stamp it also writes noopStamp.
func startNoopServer(stamp bool) (*noopServer, error) {
	now := time.Now()
	ca, err := pki.NewCA("e2ebench-noop-ca", now, 24*time.Hour)
	if err != nil {
		return nil, fmt.Errorf("no-op webhook: %w", err)
	}
	serving, err := pki.NewServingCert(ca, pki.Names{IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}, now, 24*time.Hour)
	if err != nil {
		return nil, fmt.Errorf("no-op webhook: %w", err)
	}
	s := &noopServer{caBundle: ca.CertPEM}
	annotations := map[string]string{noopAnnotation: noopAnnotationValue}
	var labels map[string]string
	if stamp {
		maps.Copy(annotations, noopStamp.annotations)
		labels = noopStamp.labels
	}
	for a := range 2 {
		for l := range 2 {
			ops := append(addOps("annotations", annotations, a == 1), addOps("labels", labels, l == 1)...)
			// And the finalizer the remover takes away, as vmipam adds
			// its own (the bench's objects carry none of their own).
			ops = append(ops, map[string]any{"op": "add", "path": "/metadata/finalizers", "value": []string{noopFinalizer}})
			if s.patches[a][l], err = json.Marshal(ops); err != nil {
				return nil, err
			}
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("no-op webhook: listen: %w", err)
	}
	tlsLn := tls.NewListener(ln, &tls.Config{
		Certificates: []tls.Certificate{*serving.TLSCertificate()},
		NextProtos:   []string{"http/1.1"},
		MinVersion:   tls.VersionTLS12,
	})
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+noopMutatePath, s.mutate)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	s.url = "https://" + ln.Addr().String()
	go func() {
		if err := s.srv.Serve(tlsLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logf("no-op webhook: %v", err)
		}
	}()
	return s, nil
}

// addOps returns the JSON patch operations that add kv to the metadata map
// field: one per key into a map that exists, or the whole map.
func addOps(field string, kv map[string]string, exists bool) []map[string]any {
	if len(kv) == 0 {
		return nil
	}
	if !exists {
		return []map[string]any{{"op": "add", "path": "/metadata/" + field, "value": kv}}
	}
	// A JSON pointer escapes "~" and "/" in a map key.
	esc := strings.NewReplacer("~", "~0", "/", "~1")
	var ops []map[string]any
	for _, k := range slices.Sorted(maps.Keys(kv)) {
		ops = append(ops, map[string]any{"op": "add", "path": "/metadata/" + field + "/" + esc.Replace(k), "value": kv[k]})
	}
	return ops
}

// stop closes the server, waiting a little for calls in flight.
func (s *noopServer) stop() {
	if s.proc != nil {
		s.stopProcess()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		logf("stop the no-op webhook: %v", err)
	}
}

// reviews returns how many reviews the mutating handler answered so far.
func (s *noopServer) reviews() int64 {
	if s.proc != nil {
		return s.remoteReviews()
	}
	return s.mutated.Load()
}

// readReview decodes the AdmissionReview of a call, answering the call
// with an error itself when it cannot.
func readReview(w http.ResponseWriter, r *http.Request) (*admissionv1.AdmissionReview, bool) {
	var review admissionv1.AdmissionReview
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, noopMaxBody)).Decode(&review); err != nil {
		http.Error(w, fmt.Sprintf("decode the AdmissionReview: %v", err), http.StatusBadRequest)
		return nil, false
	}
	if review.Request == nil {
		http.Error(w, "AdmissionReview without a request", http.StatusBadRequest)
		return nil, false
	}
	return &review, true
}

// writeReview answers a call with resp.
func writeReview(w http.ResponseWriter, resp *admissionv1.AdmissionResponse) {
	out := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"},
		Response: resp,
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(&out); err != nil {
		logf("no-op webhook: write the response: %v", err)
	}
}

// mutate allows the object with a patch adding the annotation (and
// noopStamp, with -noop-stamp) and the finalizer. Only the object's
// annotations and labels are decoded, to tell which of the fixed patches
// applies; the object is never encoded again.
func (s *noopServer) mutate(w http.ResponseWriter, r *http.Request) {
	review, ok := readReview(w, r)
	if !ok {
		return
	}
	var obj struct {
		Metadata struct {
			Annotations map[string]json.RawMessage `json:"annotations"`
			Labels      map[string]json.RawMessage `json:"labels"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(review.Request.Object.Raw, &obj); err != nil {
		http.Error(w, fmt.Sprintf("decode the object's metadata: %v", err), http.StatusBadRequest)
		return
	}
	a, l := 0, 0
	if obj.Metadata.Annotations != nil {
		a = 1
	}
	if obj.Metadata.Labels != nil {
		l = 1
	}
	patch := s.patches[a][l]
	s.mutated.Add(1)
	writeReview(w, &admissionv1.AdmissionResponse{
		UID: review.Request.UID, Allowed: true, Patch: patch, PatchType: ptr.To(admissionv1.PatchTypeJSONPatch),
	})
}

// install creates the no-op webhook's MutatingWebhookConfiguration, and
// no ValidatingWebhookConfiguration: vmipam's validation of
// VirtualMachines runs inside the API server (CRD validation rules and a
// ValidatingAdmissionPolicy), so one mutating call per create is its
// whole webhook cost and one no-op mutating call the fair floor. The
// webhook matches CREATE of VirtualMachines in nsNoop only and is
// configured like vmipam's own (failurePolicy Fail, 5 s timeout, never
// reinvoked), but with no side effects at all.
func (s *noopServer) install(ctx context.Context, c client.Client) error {
	only := &metav1.LabelSelector{MatchLabels: map[string]string{namespaceNameLabel: nsNoop}}
	rules := []admissionregv1.RuleWithOperations{{
		Operations: []admissionregv1.OperationType{admissionregv1.Create},
		Rule: admissionregv1.Rule{
			APIGroups:   []string{vmipamv1.GroupVersion.Group},
			APIVersions: []string{vmipamv1.GroupVersion.Version},
			Resources:   []string{"virtualmachines"},
		},
	}}
	m := &admissionregv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: noopConfig},
		Webhooks: []admissionregv1.MutatingWebhook{{
			Name:                    noopMutatingName,
			ClientConfig:            admissionregv1.WebhookClientConfig{URL: ptr.To(s.url + noopMutatePath), CABundle: s.caBundle},
			Rules:                   rules,
			FailurePolicy:           ptr.To(admissionregv1.Fail),
			SideEffects:             ptr.To(admissionregv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](5),
			NamespaceSelector:       only,
			ReinvocationPolicy:      ptr.To(admissionregv1.NeverReinvocationPolicy),
		}},
	}
	if err := c.Create(ctx, m); err != nil {
		return fmt.Errorf("create MutatingWebhookConfiguration %s: %w", noopConfig, err)
	}
	return nil
}

// noopAnnotated dry-runs the create of a VirtualMachine in nsNoop and
// reports whether the no-op mutating webhook annotated it.
func (b *bench) noopAnnotated(ctx context.Context) (bool, error) {
	vm := newVM(modeNoop, "")
	vm.GenerateName = "probe-"
	vm.Spec.Addresses = []string{nthAddr(noopRange, 0).String()}
	if err := b.cl.Client.Create(ctx, vm, client.DryRunAll); err != nil {
		return false, err
	}
	return vm.Annotations[noopAnnotation] == noopAnnotationValue, nil
}
