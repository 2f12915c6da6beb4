package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// noopProxyComm is the name the no-op webhook's stand-in Service runs
// under, as /proc shows it.
const noopProxyComm = "lbproxy"

// noopProxy is the stand-in for the no-op webhook's Service in the scale
// mode: hack/lbproxy, the same proxy as the one in front of vmipam's
// replicas (test/lbproxy), run as a process of its own with the no-op
// server as its one backend. A cluster puts a Service in front of either
// webhook, so both modes pay the same hop; as a process of its own, its
// CPU is counted apart ("lbproxy") and stays out of the no-op server and
// finalizer remover's figure, which is this program's.
type noopProxy struct {
	cmd  *exec.Cmd
	done chan error
	// readiness serves the no-op server's readiness over plain HTTP, for
	// the proxy's probes (nil with -noop-process, whose process serves
	// its own).
	readiness *http.Server
}

// startNoopProxy builds hack/lbproxy into dir (this program's own copy,
// from the working directory, where make runs it, so that -repo may name
// an older vmipam; else -repo's), serves the no-op server's readiness,
// starts the proxy in front of s probing every period (0: the proxy's
// default) and logging to logPath, waits until it has the server in
// rotation, and points s's URL at it.
func startNoopProxy(ctx context.Context, repo, dir, logPath string, s *noopServer, period time.Duration) (*noopProxy, error) {
	bin := filepath.Join(dir, noopProxyComm)
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./hack/lbproxy")
	build.Dir = repo
	if _, err := os.Stat(filepath.Join("hack", "lbproxy", "main.go")); err == nil {
		build.Dir = "."
	}
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build hack/lbproxy: %w: %s", err, out)
	}
	p := &noopProxy{done: make(chan error, 1)}
	// The no-op process (-noop-process) serves its own readiness, and
	// pays for the probes as vmipam's replicas do.
	readyz := s.status + "/readyz"
	if s.proc == nil {
		readyLn, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("listen for the no-op server's readiness: %w", err)
		}
		p.readiness = &http.Server{
			Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }),
			ReadHeaderTimeout: 10 * time.Second,
		}
		go func() { _ = p.readiness.Serve(readyLn) }()
		readyz = "http://" + readyLn.Addr().String() + "/readyz"
	}
	listen, err := freeLocalAddr()
	if err != nil {
		return nil, errors.Join(err, p.closeReadiness())
	}
	status, err := freeLocalAddr()
	if err != nil {
		return nil, errors.Join(err, p.closeReadiness())
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, errors.Join(err, p.closeReadiness())
	}
	backend := strings.TrimPrefix(s.url, "https://")
	p.cmd = exec.Command(bin, "--listen="+listen, "--status-bind-address="+status, "--stats-interval=0",
		"--probe-interval="+period.String(), "--backend=noop,"+backend+","+readyz)
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	if err := p.cmd.Start(); err != nil {
		return nil, errors.Join(fmt.Errorf("start %s: %w", bin, err), logFile.Close(), p.closeReadiness())
	}
	go func() {
		p.done <- p.cmd.Wait()
		_ = logFile.Close()
	}()
	err = poll(ctx, pollAPI, 30*time.Second, "the no-op webhook's stand-in Service to have its server in rotation", func() error {
		select {
		case err := <-p.done:
			p.done <- err
			return fmt.Errorf("lbproxy exited: %w (log in %s)", err, logPath)
		default:
		}
		resp, err := http.Get("http://" + status + "/readyz") //nolint:noctx // bounded by the poll
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz: %s", resp.Status)
		}
		return nil
	})
	if err != nil {
		p.stop()
		return nil, err
	}
	s.url = "https://" + listen
	return p, nil
}

// stop ends the proxy (SIGTERM, then SIGKILL after 10 s) and the
// readiness server.
func (p *noopProxy) stop() {
	stopChild(p.cmd, p.done, "the no-op webhook's stand-in Service")
	_ = p.closeReadiness()
}

// stopChild ends cmd, a child of this program whose exit done reports:
// SIGTERM, then SIGKILL after 10 s; an error it exits with is logged
// under what.
func stopChild(cmd *exec.Cmd, done chan error, what string) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		err = <-done
	}
	if err != nil {
		logf("%s: %v", what, err)
	}
}

// closeReadiness closes the readiness server, if this program serves it.
func (p *noopProxy) closeReadiness() error {
	if p.readiness == nil {
		return nil
	}
	return p.readiness.Close()
}
