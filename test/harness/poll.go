package harness

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// TB is the part of testing.TB that Eventually needs.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Eventually polls cond every 50ms until it returns nil, failing tb with
// cond's last error when timeout passes first.
func Eventually(tb TB, timeout time.Duration, what string, cond func() error) {
	tb.Helper()
	if err := Poll(context.Background(), 50*time.Millisecond, timeout, cond); err != nil {
		tb.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
	}
}

// Poll calls cond at once and then every interval until it returns nil.
// Once timeout has passed or ctx is done, it returns cond's last error.
func Poll(ctx context.Context, interval, timeout time.Duration, cond func() error) error {
	var last error
	if wait.PollUntilContextTimeout(ctx, interval, timeout, true, func(context.Context) (bool, error) {
		last = cond()
		return last == nil, nil
	}) == nil {
		return nil
	}
	return last
}
