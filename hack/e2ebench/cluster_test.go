package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestPoll(t *testing.T) {
	errNotYet := errors.New("not yet")
	tests := map[string]struct {
		okAfter int // calls; 0: never
		cancel  bool
		check   func(t *testing.T, err error, calls int)
	}{
		"at once": {okAfter: 1, check: func(t *testing.T, err error, calls int) {
			if err != nil || calls != 1 {
				t.Errorf("err %v after %d calls; want nil after 1", err, calls)
			}
		}},
		"after a few": {okAfter: 3, check: func(t *testing.T, err error, calls int) {
			if err != nil || calls != 3 {
				t.Errorf("err %v after %d calls; want nil after 3", err, calls)
			}
		}},
		"never": {check: func(t *testing.T, err error, calls int) {
			if !errors.Is(err, errNotYet) || !strings.Contains(err.Error(), "timed out after 100ms waiting for the test") {
				t.Errorf("err %v; want a timeout naming what and wrapping the last error", err)
			}
			if calls < 2 {
				t.Errorf("%d calls; want several", calls)
			}
		}},
		"cancelled": {cancel: true, check: func(t *testing.T, err error, _ int) {
			if !errors.Is(err, context.Canceled) {
				t.Errorf("err %v; want context.Canceled", err)
			}
		}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			calls := 0
			err := poll(ctx, 10*time.Millisecond, 100*time.Millisecond, "the test", func() error {
				calls++
				if tt.cancel {
					cancel()
				}
				if tt.okAfter > 0 && calls >= tt.okAfter {
					return nil
				}
				return errNotYet
			})
			tt.check(t, err, calls)
		})
	}
}
