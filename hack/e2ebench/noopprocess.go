package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vmipam/vmipam/api/scheme"
)

// noopProcessComm is the name this program runs under as the no-op
// webhook's process of its own (-noop-process), as /proc shows it: main
// runs runNoopProcess when it is started under that name.
const noopProcessComm = "noopwebhook"

// noopHello is what the no-op process prints on its standard output once
// it serves, in JSON, followed on the same line by its status server's
// address: where the API server reaches it, and how to trust it.
type noopHello struct {
	URL      string `json:"url"`
	CABundle []byte `json:"caBundle"`
}

// runNoopProcess serves the no-op mutating webhook and runs the no-op
// finalizer remover, as this program does in its own process without
// -noop-process, until SIGTERM or SIGINT. It serves over plain HTTP on
// -status the server's readiness (/readyz, for the stand-in Service's
// probes), the count of reviews it answered (/reviews) and CPU profiles
// (/debug/pprof/profile, for -profile), prints its noopHello line once it
// serves, and logs to its standard error.
func runNoopProcess(args []string) error {
	fs := flag.NewFlagSet(noopProcessComm, flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "The kubeconfig the finalizer remover uses.")
	qps := fs.Float64("qps", 0, "The finalizer remover's client QPS (0: client-go's default).")
	burst := fs.Int("burst", 0, "The finalizer remover's client burst (0: client-go's default).")
	stamp := fs.Bool("stamp", false, "Write the no-op stamp as well (e2ebench's -noop-stamp).")
	status := fs.String("status", "127.0.0.1:0", "Where to serve /readyz, /reviews and /debug/pprof/profile over plain HTTP.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig %q: %w", *kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = float32(*qps), *burst
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	s, err := startNoopServer(*stamp)
	if err != nil {
		return err
	}
	defer s.stop()
	statusLn, err := net.Listen("tcp", *status)
	if err != nil {
		return fmt.Errorf("listen for the status: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /reviews", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, strconv.FormatInt(s.reviews(), 10))
	})
	// For -profile, as vmipam serves it.
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	statusSrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = statusSrv.Serve(statusLn) }()
	defer statusSrv.Close() //nolint:errcheck // exiting
	startRemover(ctx, c)
	hello, err := json.Marshal(noopHello{URL: s.url, CABundle: s.caBundle})
	if err != nil {
		return err
	}
	fmt.Printf("%s %s\n", hello, statusLn.Addr())
	<-ctx.Done()
	return nil
}

// startNoopProcess starts this program as the no-op webhook's process of
// its own (runNoopProcess, under noopProcessComm through a symbolic link in
// dir), logging to logPath, with the finalizer remover reading kubeconfig
// at qps and burst, and waits until it serves. Its CPU then counts apart,
// as the noopProcessComm row, and the no-op server and finalizer remover
// pay their own runtime's costs (its scheduler's wake-ups, its collector),
// as a webhook in a Pod of its own does, instead of sharing this
// program's busy one.
func startNoopProcess(ctx context.Context, dir, logPath, kubeconfig string, qps float32, burst int, stamp bool) (*noopServer, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find this program: %w", err)
	}
	bin := filepath.Join(dir, noopProcessComm)
	if err := os.Symlink(self, bin); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("link %s: %w", bin, err)
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "-kubeconfig="+kubeconfig, "-qps="+strconv.FormatFloat(float64(qps), 'f', -1, 32),
		"-burst="+strconv.Itoa(burst), "-stamp="+strconv.FormatBool(stamp))
	cmd.Stderr = logFile
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, errors.Join(err, logFile.Close())
	}
	if err := cmd.Start(); err != nil {
		return nil, errors.Join(fmt.Errorf("start %s: %w", bin, err), logFile.Close())
	}
	s := &noopServer{proc: cmd, done: make(chan error, 1)}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, out)
		s.done <- cmd.Wait()
		_ = logFile.Close()
	}()
	var line string
	select {
	case line = <-lines:
	case <-ctx.Done():
		err = ctx.Err()
	case <-time.After(30 * time.Second):
		err = errors.New("it did not serve within 30s")
	}
	hello, status, ok := strings.Cut(line, " ")
	var h noopHello
	if err == nil && (!ok || json.Unmarshal([]byte(hello), &h) != nil) {
		err = fmt.Errorf("it printed %q, not where it serves", line)
	}
	if err != nil {
		s.stop()
		return nil, fmt.Errorf("the no-op webhook's process (log in %s): %w", logPath, err)
	}
	s.url, s.caBundle, s.status = h.URL, h.CABundle, "http://"+status
	return s, nil
}

// remoteReviews reads the count of reviews the no-op process answered, or
// -1 when it cannot.
func (s *noopServer) remoteReviews() int64 {
	resp, err := http.Get(s.status + "/reviews") //nolint:noctx // loopback, answered at once
	if err != nil {
		logf("the no-op webhook's process: %v", err)
		return -1
	}
	defer resp.Body.Close() //nolint:errcheck // read-only
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		logf("the no-op webhook's process: %v", err)
		return -1
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		logf("the no-op webhook's process: reviews %q: %v", b, err)
		return -1
	}
	return n
}

// stopProcess ends the no-op process (SIGTERM, then SIGKILL after 10 s).
func (s *noopServer) stopProcess() {
	stopChild(s.proc, s.done, "the no-op webhook's process")
}
