package main

import (
	"strings"
	"testing"
	"time"
)

func TestValidateLeaseFlags(t *testing.T) {
	tests := []struct {
		name                string
		lease, renew, retry time.Duration
		wantErr             string
	}{
		{"defaults", 15 * time.Second, 10 * time.Second, 2 * time.Second, ""},
		{"long outages", 120 * time.Second, 90 * time.Second, 5 * time.Second, ""},
		{"lease not longer than renew", 10 * time.Second, 10 * time.Second, 2 * time.Second, "--leader-elect-lease-duration (10s) must be longer"},
		{"renew too close to retry", 15 * time.Second, 2 * time.Second, 2 * time.Second, "1.2 × --leader-elect-retry-period"},
		{"zero", 0, 10 * time.Second, 2 * time.Second, "must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := options{leaseDuration: tt.lease, renewDeadline: tt.renew, retryPeriod: tt.retry}.validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("validate() = %v, want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("validate() = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}
