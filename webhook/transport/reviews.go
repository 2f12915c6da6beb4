package transport

import (
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
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// Reviews turns HTTP requests into admission reviews for a handler, with
// bounded memory, CPU time and concurrency: it reads at most
// Limits.MaxBodyBytes within Limits.ReadTimeout, holds at most
// Limits.MaxInflightBytes of bodies at once, decodes the AdmissionReview
// envelope without copying the objects it carries (the handlers read them
// with kinds.Kind.Read), gives each handler a context that ends at the
// request's ?timeout=, and encodes the handler's answer. One Reviews is
// shared by all of vmipam's webhooks, so the bounds hold for them together.
type Reviews struct {
	limits   Limits
	bytes    *semaphore.Weighted
	requests *semaphore.Weighted
}

// NewReviews returns a Reviews with the given limits (zero fields take the
// defaults).
func NewReviews(l Limits) *Reviews {
	l = l.withDefaults()
	return &Reviews{limits: l, bytes: semaphore.NewWeighted(l.MaxInflightBytes), requests: semaphore.NewWeighted(l.MaxConcurrent)}
}

// Handler returns the http.Handler that serves h the reviews it receives.
func (s *Reviews) Handler(h admission.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.serve(w, r, h) })
}

func (s *Reviews) serve(w http.ResponseWriter, r *http.Request, h admission.Handler) {
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
func (s *Reviews) timeout(r *http.Request) time.Duration {
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
