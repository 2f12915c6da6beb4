package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/semaphore"
	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/vmipam/vmipam/lib/jsonscan"
)

// Limits bound what one admission request may cost vmipam. The defaults
// fit the Deployment's 512 MiB memory limit with room to spare: at most
// MaxInflightBytes of request bodies are held at once, whatever the
// number of callers.
type Limits struct {
	// MaxBodyBytes refuses a larger request body (413) before reading it.
	// Default 7 MiB: an AdmissionReview of the largest object the API
	// server stores (3 MiB by default) with its old version.
	MaxBodyBytes int64
	// MaxInflightBytes bounds the bodies held by admissions in flight; a
	// request waits for room until its deadline, then is refused (429).
	// Default 64 MiB.
	MaxInflightBytes int64
	// MaxConcurrent bounds the admissions handled at once; more wait, as
	// above. Default 64.
	MaxConcurrent int64
	// ReadTimeout bounds the reading of a request body, so a caller that
	// sends slowly cannot hold a connection and its memory. Default 10s.
	ReadTimeout time.Duration
	// DefaultTimeout is the deadline of a request that carries no
	// ?timeout= (the API server always sends one), and MaxTimeout caps
	// the deadline a request asks for. Defaults 10s and 30s, the API
	// server's own default and maximum for webhooks.
	DefaultTimeout, MaxTimeout time.Duration
	// Draining, when set and true, makes each response close its
	// connection, so that a caller keeping connections alive (the API
	// server) dials again and reaches a replica that is not shutting down.
	Draining func() bool
}

// Defaults of Limits.
const (
	DefaultMaxBodyBytes     = 7 << 20
	DefaultMaxInflightBytes = 64 << 20
	DefaultMaxConcurrent    = 64
)

// minCharge is what a request counts against MaxInflightBytes at least:
// its decoding and the response cost more than a tiny body.
const minCharge = 64 << 10

func (l Limits) withDefaults() Limits {
	if l.MaxBodyBytes <= 0 {
		l.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if l.MaxInflightBytes <= 0 {
		l.MaxInflightBytes = DefaultMaxInflightBytes
	}
	l.MaxInflightBytes = max(l.MaxInflightBytes, l.MaxBodyBytes)
	if l.MaxConcurrent <= 0 {
		l.MaxConcurrent = DefaultMaxConcurrent
	}
	if l.ReadTimeout <= 0 {
		l.ReadTimeout = 10 * time.Second
	}
	if l.DefaultTimeout <= 0 {
		l.DefaultTimeout = 10 * time.Second
	}
	if l.MaxTimeout <= 0 {
		l.MaxTimeout = 30 * time.Second
	}
	return l
}

// Server serves admission handlers over HTTP with bounded memory, CPU
// time and concurrency: it reads at most Limits.MaxBodyBytes within
// Limits.ReadTimeout, holds at most Limits.MaxInflightBytes of bodies at
// once, decodes the AdmissionReview envelope without copying the objects
// it carries (the handlers read them with kinds.Kind.Read), and gives
// each handler a context that ends at the request's ?timeout=. One Server
// is shared by all of vmipam's webhooks, so the bounds hold for them
// together.
type Server struct {
	limits   Limits
	bytes    *semaphore.Weighted
	requests *semaphore.Weighted
}

// NewServer returns a Server with the given limits (zero fields take the
// defaults).
func NewServer(l Limits) *Server {
	l = l.withDefaults()
	return &Server{limits: l, bytes: semaphore.NewWeighted(l.MaxInflightBytes), requests: semaphore.NewWeighted(l.MaxConcurrent)}
}

// Handler returns the http.Handler serving h.
func (s *Server) Handler(h admission.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.serve(w, r, h) })
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request, h admission.Handler) {
	if d := s.limits.Draining; d != nil && d() {
		w.Header().Set("Connection", "close")
	}
	if r.Method != http.MethodPost {
		http.Error(w, "admission webhooks take POST", http.StatusMethodNotAllowed)
		return
	}
	if ct, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || ct != "application/json" {
		http.Error(w, "an AdmissionReview must be sent as application/json", http.StatusUnsupportedMediaType)
		return
	}
	if r.ContentLength > s.limits.MaxBodyBytes {
		http.Error(w, fmt.Sprintf("request body of %d bytes is larger than the limit of %d bytes", r.ContentLength, s.limits.MaxBodyBytes), http.StatusRequestEntityTooLarge)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.timeout(r))
	defer cancel()
	// Room first, then the body: a flood of large requests waits here
	// instead of piling up in memory.
	charge := s.limits.MaxBodyBytes
	if r.ContentLength >= 0 {
		charge = max(r.ContentLength, minCharge)
	}
	if err := s.requests.Acquire(ctx, 1); err != nil {
		http.Error(w, "vmipam is busy with other admissions; retry", http.StatusTooManyRequests)
		return
	}
	defer s.requests.Release(1)
	if err := s.bytes.Acquire(ctx, charge); err != nil {
		http.Error(w, "vmipam is busy with other admissions; retry", http.StatusTooManyRequests)
		return
	}
	defer s.bytes.Release(charge)
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.limits.ReadTimeout))
	body, err := readBody(http.MaxBytesReader(w, r.Body, s.limits.MaxBodyBytes), r.ContentLength)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			http.Error(w, fmt.Sprintf("request body is larger than the limit of %d bytes", s.limits.MaxBodyBytes), http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "read request body: "+err.Error(), http.StatusBadRequest)
		return
	}
	req, err := decodeReview(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	out, err := encodeReview(req.UID, h.Handle(ctx, req))
	if err != nil {
		logf.FromContext(r.Context()).Error(err, "Encoding admission response")
		out, err = marshalReview(req.UID, admission.Errored(http.StatusInternalServerError, err))
	}
	if err != nil {
		http.Error(w, "encode response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if _, err := w.Write(out); err != nil {
		logf.FromContext(r.Context()).V(1).Info("Writing admission response", "error", err.Error())
	}
}

// readBody reads a request body of the announced length into one buffer
// of that size, not the doubling buffers of io.ReadAll, so a body costs its
// own size once.
func readBody(r io.Reader, n int64) ([]byte, error) {
	if n < 0 {
		return io.ReadAll(r)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, err
	}
	// Anything past the announced length is an error of the sender's.
	var one [1]byte
	if k, err := r.Read(one[:]); k > 0 || err != nil && !errors.Is(err, io.EOF) {
		return nil, errors.New("the request body is longer than its Content-Length")
	}
	return buf, nil
}

// timeout is the deadline the API server gave the request (?timeout=5s),
// capped.
func (s *Server) timeout(r *http.Request) time.Duration {
	d := s.limits.DefaultTimeout
	if v := queryValue(r.URL.RawQuery, "timeout"); v != "" {
		if t, err := time.ParseDuration(v); err == nil && t > 0 {
			d = t
		} else if n, err := strconv.Atoi(v); err == nil && n > 0 {
			d = time.Duration(n) * time.Second
		}
	}
	return min(d, s.limits.MaxTimeout)
}

// queryValue returns the first value of key in the raw query string q, as
// url.Values.Get would, without parsing every parameter into a map: every
// admission reads its timeout.
func queryValue(q, key string) string {
	for q != "" {
		var kv string
		kv, q, _ = strings.Cut(q, "&")
		k, v, _ := strings.Cut(kv, "=")
		if k, err := url.QueryUnescape(k); err != nil || k != key {
			continue
		}
		if v, err := url.QueryUnescape(v); err == nil {
			return v
		}
		return ""
	}
	return ""
}

// The review's fields, by their index in reviewPaths: only those a
// handler reads. (The requesting user, requestKind and requestResource are
// left out: no handler reads them.)
const (
	rvAPIVersion = iota
	rvKind
	rvUID
	rvKindGroup
	rvKindVersion
	rvKindKind
	rvResourceGroup
	rvResourceVersion
	rvResourceResource
	rvSubResource
	rvName
	rvNamespace
	rvOperation
	rvObject
	rvOldObject
	rvDryRun
)

var reviewPaths = [][]string{
	rvAPIVersion: {"apiVersion"}, rvKind: {"kind"}, rvUID: {"request", "uid"},
	rvKindGroup: {"request", "kind", "group"}, rvKindVersion: {"request", "kind", "version"}, rvKindKind: {"request", "kind", "kind"},
	rvResourceGroup: {"request", "resource", "group"}, rvResourceVersion: {"request", "resource", "version"},
	rvResourceResource: {"request", "resource", "resource"},
	rvSubResource:      {"request", "subResource"},
	rvName:             {"request", "name"}, rvNamespace: {"request", "namespace"}, rvOperation: {"request", "operation"},
	rvObject: {"request", "object"}, rvOldObject: {"request", "oldObject"},
	rvDryRun: {"request", "dryRun"},
}

// decodeReview reads an AdmissionReview v1 request in one pass over the
// body, decoding only the strings and the flag the handlers read, with no
// reflection: the objects it carries stay
// slices of the body (the handlers read them with kinds.Kind.Read), so
// a request costs its body's bytes and a scan, however large its object.
// The body is not validated as a whole: the API server sends valid JSON,
// and a forged body gains nothing from a parse that differs (every field a
// handler uses is decoded strictly).
func decodeReview(body []byte) (admission.Request, error) {
	if jsonscan.KindOf(body) != jsonscan.KindObject {
		return admission.Request{}, errors.New("the request body is not a JSON object")
	}
	v := jsonscan.Extract(body, reviewPaths...)
	var errs []error
	str := func(i int, name string) string {
		if v[i] == nil {
			return ""
		}
		s, err := jsonscan.String(v[i])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
		return s
	}
	apiVersion, kind := str(rvAPIVersion, "apiVersion"), str(rvKind, "kind")
	if apiVersion != admissionv1.SchemeGroupVersion.String() || kind != "AdmissionReview" {
		return admission.Request{}, fmt.Errorf("the request body is a %q %q; vmipam serves admission.k8s.io/v1 AdmissionReview only (admissionReviewVersions: [v1])",
			apiVersion, kind)
	}
	var q admissionv1.AdmissionRequest
	q.UID = types.UID(str(rvUID, "request.uid"))
	q.Kind = metav1.GroupVersionKind{
		Group: str(rvKindGroup, "request.kind.group"), Version: str(rvKindVersion, "request.kind.version"), Kind: str(rvKindKind, "request.kind.kind"),
	}
	q.Resource = metav1.GroupVersionResource{
		Group: str(rvResourceGroup, "request.resource.group"), Version: str(rvResourceVersion, "request.resource.version"),
		Resource: str(rvResourceResource, "request.resource.resource"),
	}
	q.SubResource = str(rvSubResource, "request.subResource")
	q.Name, q.Namespace = str(rvName, "request.name"), str(rvNamespace, "request.namespace")
	q.Operation = admissionv1.Operation(str(rvOperation, "request.operation"))
	switch d := v[rvDryRun]; {
	case d == nil || jsonscan.KindOf(d) == jsonscan.KindNull:
	case jsonscan.KindOf(d) != jsonscan.KindBool:
		errs = append(errs, fmt.Errorf("request.dryRun: must be true or false, not %s", jsonscan.KindOf(d)))
	default:
		dry := bytes.TrimSpace(d)[0] == 't'
		q.DryRun = &dry
	}
	for i, into := range map[int]*runtime.RawExtension{rvObject: &q.Object, rvOldObject: &q.OldObject} {
		if raw := v[i]; raw != nil && jsonscan.KindOf(raw) != jsonscan.KindNull {
			// A slice of the body, not a copy: the body outlives the
			// request's handling.
			into.Raw = raw
		}
	}
	if len(errs) > 0 {
		return admission.Request{}, fmt.Errorf("the request body is not a valid AdmissionReview: %w", errors.Join(errs...))
	}
	if q.UID == "" {
		return admission.Request{}, errors.New("the AdmissionReview holds no request with a uid")
	}
	return admission.Request{AdmissionRequest: q}, nil
}

// deny turns a StatusError into a denial that keeps its code and details,
// so kubectl prints the field and the reason.
func deny(err *apierrors.StatusError) admission.Response {
	st := err.Status()
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &st}}
}
