package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vmipam/vmipam/api/scheme"
	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/test/harness"
)

// Namespaces of the four modes and the pool the runs with vmipam name.
const (
	nsWith     = "bench-with"
	nsWithout  = "bench-without"
	nsNoop     = "bench-noop"
	nsBaseline = "bench-baseline"
	poolName   = "bench"

	namespaceNameLabel = "kubernetes.io/metadata.name"
)

// excludeFromWebhooks adds namespaces to the NotIn namespaceSelector of
// every webhook in vmipam's configurations, vmipam-mutating and
// vmipam-validating, so that the API server does not call vmipam for
// objects in them. vmipam-validating may be missing (vmipam validates
// VirtualMachines inside the API server; what deploy/ puts in that
// configuration may change): then there is nothing to exclude from it.
// The same namespaces leave the bindings of vmipam's admission policies.
// vmipam itself only keeps the caBundle of these configurations, so the
// change stays.
func excludeFromWebhooks(ctx context.Context, c client.Client, namespaces ...string) error {
	exclude := func(sel *metav1.LabelSelector) *metav1.LabelSelector {
		if sel == nil {
			sel = &metav1.LabelSelector{}
		}
		for i, e := range sel.MatchExpressions {
			if e.Key == namespaceNameLabel && e.Operator == metav1.LabelSelectorOpNotIn {
				for _, ns := range namespaces {
					if !slices.Contains(e.Values, ns) {
						sel.MatchExpressions[i].Values = append(sel.MatchExpressions[i].Values, ns)
					}
				}
				return sel
			}
		}
		sel.MatchExpressions = append(sel.MatchExpressions, metav1.LabelSelectorRequirement{
			Key: namespaceNameLabel, Operator: metav1.LabelSelectorOpNotIn, Values: namespaces,
		})
		return sel
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var m admissionregv1.MutatingWebhookConfiguration
		if err := c.Get(ctx, client.ObjectKey{Name: "vmipam-mutating"}, &m); err != nil {
			return err
		}
		for i := range m.Webhooks {
			m.Webhooks[i].NamespaceSelector = exclude(m.Webhooks[i].NamespaceSelector)
		}
		return c.Update(ctx, &m)
	})
	if err != nil {
		return fmt.Errorf("exclude %v from vmipam-mutating: %w", namespaces, err)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var v admissionregv1.ValidatingWebhookConfiguration
		switch err := c.Get(ctx, client.ObjectKey{Name: "vmipam-validating"}, &v); {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return err
		}
		for i := range v.Webhooks {
			v.Webhooks[i].NamespaceSelector = exclude(v.Webhooks[i].NamespaceSelector)
		}
		return c.Update(ctx, &v)
	})
	if err != nil {
		return fmt.Errorf("exclude %v from vmipam-validating: %w", namespaces, err)
	}
	// vmipam's admission policies refuse an address vmipam did not stamp
	// on an object in scope: the modes without vmipam give static
	// addresses of their own.
	var bindings admissionregv1.ValidatingAdmissionPolicyBindingList
	if err := c.List(ctx, &bindings); err != nil {
		return fmt.Errorf("list admission policy bindings: %w", err)
	}
	for _, b := range bindings.Items {
		if !strings.HasPrefix(b.Name, "vmipam-") {
			continue
		}
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var cur admissionregv1.ValidatingAdmissionPolicyBinding
			if err := c.Get(ctx, client.ObjectKey{Name: b.Name}, &cur); err != nil {
				return err
			}
			if cur.Spec.MatchResources == nil {
				cur.Spec.MatchResources = &admissionregv1.MatchResources{}
			}
			cur.Spec.MatchResources.NamespaceSelector = exclude(cur.Spec.MatchResources.NamespaceSelector)
			return c.Update(ctx, &cur)
		})
		if err != nil {
			return fmt.Errorf("exclude %v from %s: %w", namespaces, b.Name, err)
		}
	}
	return nil
}

// setupObjects creates the namespaces, the IPPool and the baseline's pool
// object.
func (b *bench) setupObjects(ctx context.Context) error {
	c := b.cl.Client
	for _, ns := range []string{nsWith, nsWithout, nsNoop, nsBaseline} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}
	pool := &vmipamv1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: poolName},
		Spec: vmipamv1.IPPoolSpec{
			Ranges:   []vmipamv1.IPRange{{CIDR: b.opts.poolCIDR}},
			Cooldown: &metav1.Duration{Duration: b.opts.cooldown},
		},
	}
	if err := c.Create(ctx, pool); err != nil {
		return fmt.Errorf("create IPPool %s: %w", poolName, err)
	}
	return b.base.reset(ctx, c)
}

// newClients returns the clients of the workers: each with its own
// transport (so its own HTTP/2 connection), or one shared by all.
func (b *bench) newClients() ([]client.Client, error) {
	mapper := b.cl.Client.RESTMapper()
	newClient := func() (client.Client, error) {
		cfg := rest.CopyConfig(b.cl.Config)
		// client-go caches transports by configuration; a Proxy function
		// makes the configuration uncacheable, hence a new connection.
		cfg.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil }
		hc, err := rest.HTTPClientFor(cfg)
		if err != nil {
			return nil, err
		}
		return client.New(cfg, client.Options{Scheme: scheme.Scheme, Mapper: mapper, HTTPClient: hc})
	}
	clients := make([]client.Client, b.opts.c)
	for i := range clients {
		if b.opts.clients == "shared" && i > 0 {
			clients[i] = clients[0]
			continue
		}
		c, err := newClient()
		if err != nil {
			return nil, fmt.Errorf("client: %w", err)
		}
		clients[i] = c
	}
	return clients, nil
}

// waitStamped waits until vmipam's webhook stamps a dry-run create in the
// namespace it serves.
func (b *bench) waitStamped(ctx context.Context) error {
	return poll(ctx, pollAPI, 60*time.Second, "vmipam to stamp a dry-run VirtualMachine in "+nsWith, func() error {
		ok, err := b.stamped(ctx, nsWith)
		if err == nil && !ok {
			err = errors.New("not stamped")
		}
		return err
	})
}

// stamped dry-runs the create of a VirtualMachine without an address in ns
// and reports whether vmipam's mutating webhook stamped it.
func (b *bench) stamped(ctx context.Context, ns string) (bool, error) {
	vm := &vmipamv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "probe-"},
		Spec:       vmipamv1.VirtualMachineSpec{IPPool: poolName},
	}
	if err := b.cl.Client.Create(ctx, vm, client.DryRunAll); err != nil {
		return false, err
	}
	return vm.Annotations[vmipamv1.PoolAnnotation] != "" || slices.Contains(vm.Finalizers, vmipamv1.Finalizer), nil
}

// waitWebhooks waits until the API server calls vmipam for nsWith (and the
// pool serves) and has stopped calling it for the excluded namespaces: no
// stamp, and vmipam's admission counters do not move. With the no-op
// webhook, it also waits until it annotates in nsNoop.
func (b *bench) waitWebhooks(ctx context.Context) error {
	if err := b.waitStamped(ctx); err != nil {
		return err
	}
	if b.noop != nil {
		if err := poll(ctx, pollAPI, 60*time.Second, "the no-op webhook to annotate a dry-run VirtualMachine in "+nsNoop, func() error {
			ok, err := b.noopAnnotated(ctx)
			if err == nil && !ok {
				err = errors.New("no annotation " + noopAnnotation)
			}
			return err
		}); err != nil {
			return err
		}
	}
	for _, ns := range []string{nsWithout, nsNoop, nsBaseline} {
		if err := poll(ctx, pollAPI, 60*time.Second, "the API server to stop calling vmipam for "+ns, func() error {
			before, err := b.admissions()
			if err != nil {
				return err
			}
			var noopBefore int64
			if b.noop != nil {
				noopBefore = b.noop.reviews()
			}
			for range 3 {
				ok, err := b.stamped(ctx, ns)
				if err != nil {
					return err
				}
				if ok {
					return errors.New("still stamped")
				}
			}
			after, err := b.admissions()
			if err != nil {
				return err
			}
			if after != before {
				return fmt.Errorf("vmipam still admitted %v requests", after-before)
			}
			// The no-op webhook matches its own namespace only.
			if b.noop != nil && ns != nsNoop && b.noop.reviews() != noopBefore {
				return fmt.Errorf("the no-op webhook was called for %s", ns)
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// admissions counts the VirtualMachine admission requests vmipam served.
func (b *bench) admissions() (float64, error) {
	m, err := b.vmipamMetrics()
	if err != nil {
		return 0, err
	}
	n := m.sum("vmipam_admission_duration_seconds_count", map[string]string{"webhook": "virtualmachine-mutating"})
	n += m.sum("vmipam_admission_duration_seconds_count", map[string]string{"webhook": "virtualmachine-validating"})
	return n, nil
}

func (b *bench) vmipamMetrics() (metricSet, error) {
	if rs := b.replicas(); rs != nil && b.opts.fleet > 0 {
		// Every replica's samples, one after the other: sums and
		// histograms add them up.
		var all metricSet
		for _, r := range rs.Live() {
			text, err := r.Metrics()
			if err != nil {
				return nil, fmt.Errorf("read the metrics of replica %d: %w", r.Index, err)
			}
			m, err := parseMetrics(text)
			if err != nil {
				return nil, fmt.Errorf("the metrics of replica %d: %w", r.Index, err)
			}
			all = append(all, m...)
		}
		return all, nil
	}
	text, err := b.cl.Metrics()
	if err != nil {
		return nil, fmt.Errorf("read vmipam's metrics: %w", err)
	}
	m, err := parseMetrics(text)
	if err != nil {
		return nil, fmt.Errorf("vmipam's metrics: %w", err)
	}
	return m, nil
}

// bothMetrics reads vmipam's metrics and then the API server's.
func (b *bench) bothMetrics(ctx context.Context) (vmipam, apiserver metricSet, err error) {
	if vmipam, err = b.vmipamMetrics(); err != nil {
		return nil, nil, err
	}
	if apiserver, err = b.apiserverMetrics(ctx); err != nil {
		return nil, nil, err
	}
	return vmipam, apiserver, nil
}

// apiserverMetrics reads the API server's /metrics.
func (b *bench) apiserverMetrics(ctx context.Context) (metricSet, error) {
	text, err := b.apiserverMetricsText(ctx)
	if err != nil {
		return nil, err
	}
	m, err := parseMetrics(text)
	if err != nil {
		return nil, fmt.Errorf("the API server's metrics: %w", err)
	}
	return m, nil
}

func (b *bench) apiserverMetricsText(ctx context.Context) (string, error) {
	buf, err := b.apiserverGet(ctx, "/metrics")
	if err != nil {
		return "", fmt.Errorf("read the API server's metrics: %w", err)
	}
	return string(buf), nil
}

// apiserverGet reads a non-resource path of the API server, such as
// /metrics or /debug/pprof/profile.
func (b *bench) apiserverGet(ctx context.Context, path string) ([]byte, error) {
	hc, err := rest.HTTPClientFor(b.cl.Config)
	if err != nil {
		return nil, err
	}
	return get(ctx, hc, strings.TrimSuffix(b.cl.Config.Host, "/")+path)
}

// profile starts CPU profiles of the API server, of this program, of the
// no-op process (-noop-process) and of vmipam (when it serves pprof) for
// d, written to the results folder as e2e-bench-apiserver-<name>.pprof,
// e2e-bench-e2ebench-<name>.pprof, e2e-bench-noopwebhook-<name>.pprof and
// e2e-bench-vmipam-<name>.pprof (in the scale mode
// e2e-bench-vmipam-<name>-<i>.pprof, one per replica); the returned
// function waits for them.
func (b *bench) profile(ctx context.Context, name string, d time.Duration) func() {
	path := fmt.Sprintf("/debug/pprof/profile?seconds=%d", int(d.Seconds()))
	var wg sync.WaitGroup
	take := func(file string, get func() ([]byte, error)) {
		wg.Go(func() {
			buf, err := get()
			if err == nil {
				err = os.WriteFile(filepath.Join(b.results, file), buf, 0o644)
			}
			if err != nil {
				logf("profile for %s: %v", file, err)
			}
		})
	}
	take(apiserverProfile(name), func() ([]byte, error) { return b.apiserverGet(ctx, path) })
	// And this program's own: its CPU is the no-op webhook server's and
	// finalizer remover's in the goal's figures, and the stand-in Service's.
	take("e2e-bench-e2ebench-"+name+".pprof", func() ([]byte, error) { return selfProfile(ctx, d) })
	if b.noop != nil && b.noop.proc != nil {
		// The no-op server and finalizer remover in their own process.
		take("e2e-bench-"+noopProcessComm+"-"+name+".pprof", func() ([]byte, error) { return get(ctx, http.DefaultClient, b.noop.status+path) })
	}
	if rs := b.replicas(); rs != nil {
		// The scale mode's replicas, each in its own file.
		for i, rep := range rs.Live() {
			take(fmt.Sprintf("e2e-bench-vmipam-%s-%d.pprof", name, i), func() ([]byte, error) { return replicaPprof(ctx, rep, path) })
		}
	} else if b.vmipamPprof != "" {
		take("e2e-bench-vmipam-"+name+".pprof", func() ([]byte, error) { return get(ctx, http.DefaultClient, "http://"+b.vmipamPprof+path) })
	}
	return wg.Wait
}

// selfProfile profiles this program's CPU for d (or until ctx ends).
func selfProfile(ctx context.Context, d time.Duration) ([]byte, error) {
	var buf bytes.Buffer
	if err := pprof.StartCPUProfile(&buf); err != nil {
		return nil, err
	}
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	pprof.StopCPUProfile()
	return buf.Bytes(), ctx.Err()
}

// get reads url with hc and fails on any status but 200.
func get(ctx context.Context, hc *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	buf, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %.200s", url, resp.Status, buf)
	}
	return buf, nil
}

// freeLocalAddr returns a loopback address with a port free now, chosen
// as the harness chooses vmipam's other ports (harness.FreePort).
func freeLocalAddr() (string, error) {
	port, err := harness.FreePort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}

// anyVM lists at most one VirtualMachine in ns (and matching opts, such
// as a label selector), by metadata only.
func (b *bench) anyVM(ctx context.Context, ns string, opts ...client.ListOption) (bool, error) {
	var l metav1.PartialObjectMetadataList
	l.SetGroupVersionKind(vmipamv1.GroupVersion.WithKind("VirtualMachineList"))
	if err := b.cl.Client.List(ctx, &l, append([]client.ListOption{client.InNamespace(ns), client.Limit(1)}, opts...)...); err != nil {
		return false, err
	}
	return len(l.Items) > 0, nil
}

// waitGone polls until ns holds no VirtualMachine (matching opts) and
// returns when that was first seen.
func (b *bench) waitGone(ctx context.Context, ns string, timeout time.Duration, opts ...client.ListOption) (time.Time, error) {
	var gone time.Time
	err := poll(ctx, pollAPI, timeout, "every VirtualMachine in "+ns+" to be gone", func() error {
		any, err := b.anyVM(ctx, ns, opts...)
		if err != nil {
			return err
		}
		if any {
			return errors.New("some remain")
		}
		gone = time.Now()
		return nil
	})
	return gone, err
}

// poolCounts reads the bench pool's address gauges from vmipam's metrics.
func (b *bench) poolCounts() (map[string]float64, error) {
	m, err := b.vmipamMetrics()
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, s := range m {
		if s.Name == "vmipam_pool_addresses" && s.Labels["pool"] == poolName {
			out[s.Labels["state"]] = s.Value
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no vmipam_pool_addresses for the bench pool")
	}
	return out, nil
}

// Poll intervals: of the API server, and of vmipam's metrics (rendering
// them costs vmipam CPU, so less often).
const (
	pollAPI     = 20 * time.Millisecond
	pollMetrics = 100 * time.Millisecond
)

// poll calls f every interval until it returns nil or timeout passes, and
// names what it waited for and f's last error when it gives up.
func poll(ctx context.Context, interval, timeout time.Duration, what string, f func() error) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, interval, timeout, true, func(context.Context) (bool, error) {
		last = f()
		return last == nil, nil
	})
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case last != nil:
		return fmt.Errorf("timed out after %s waiting for %s: %w", timeout, what, last)
	}
	return fmt.Errorf("waiting for %s: %w", what, err)
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
