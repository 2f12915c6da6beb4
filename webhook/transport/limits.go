package transport

import "time"

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
