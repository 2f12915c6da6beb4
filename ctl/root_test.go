package ctl

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"k8s.io/cli-runtime/pkg/genericiooptions"
)

// TestRootRefusesBadInput runs the commands with input they must refuse
// before they reach any API server (the kubeconfig points at none), each
// with exit status 2 and a message naming the flag or argument.
func TestRootRefusesBadInput(t *testing.T) {
	tests := map[string]struct {
		args    []string
		wantErr string
	}{
		"unknown output":                  {args: []string{"pools", "-o", "wide"}, wantErr: `--output "wide"`},
		"empty vmipam namespace":          {args: []string{"pools", "--vmipam-namespace", ""}, wantErr: "--vmipam-namespace is empty"},
		"who of no address":               {args: []string{"who", "10.0.0"}, wantErr: `"10.0.0" is not an IP address`},
		"who of a zoned address":          {args: []string{"who", "fe80::1%eth0"}, wantErr: "is not an IP address"},
		"who without an address":          {args: []string{"who"}, wantErr: "accepts 1 arg"},
		"history --at garbage":            {args: []string{"history", "10.0.0.1", "--at", "noon"}, wantErr: `--at "noon"`},
		"history --since empty":           {args: []string{"history", "10.0.0.1", "--since", ""}, wantErr: "--since is empty"},
		"release --skip-cooldown alone":   {args: []string{"release", "10.0.0.1", "--skip-cooldown"}, wantErr: "--skip-cooldown needs --reason"},
		"release with a zero timeout":     {args: []string{"release", "10.0.0.1", "--timeout", "0s"}, wantErr: "--timeout 0s"},
		"check with a negative grace":     {args: []string{"check", "--grace", "-1s"}, wantErr: "--grace -1s is negative"},
		"check with a missing kinds file": {args: []string{"check", "--kinds-config", "/nonexistent/kinds.yaml"}, wantErr: "--kinds-config"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			root := NewRoot(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &out})
			root.SetArgs(append([]string{"--kubeconfig", "/nonexistent/kubeconfig", "--server", "https://127.0.0.1:1"}, tt.args...))
			err := root.ExecuteContext(t.Context())
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
			}
			if code := ExitCode(err); code != ExitError {
				t.Errorf("exit %d, want %d", code, ExitError)
			}
		})
	}
}

func TestExitCode(t *testing.T) {
	tests := map[string]struct {
		err    error
		code   int
		silent bool
	}{
		"none":                 {code: ExitOK},
		"an error":             {err: errors.New("boom"), code: ExitError},
		"findings, wrapped":    {err: errors.Join(errors.New("x"), findings("%d findings", 2)), code: ExitFindings, silent: true},
		"a timeout of release": {err: withCode(ExitFindings, errors.New("no replica acted")), code: ExitFindings},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if got := ExitCode(tt.err); got != tt.code {
				t.Errorf("ExitCode = %d, want %d", got, tt.code)
			}
			if got := Silent(tt.err); got != tt.silent {
				t.Errorf("Silent = %v, want %v", got, tt.silent)
			}
		})
	}
}
