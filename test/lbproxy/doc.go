// Package lbproxy is a small round-robin TCP proxy that stands in for a
// Kubernetes Service (kube-proxy in front of the endpoints of a
// Deployment) where there is no cluster network: the end-to-end tests, the
// reliability suite, the benchmark and `make local-up REPLICAS=N` run
// several vmipam replicas on loopback behind one address, the one the
// webhook configurations point at.
//
// What it does as kube-proxy does:
//   - Each new connection goes to one backend whose readiness probe
//     passes, and stays there for its whole life: balancing is per
//     connection, never per request, so an API server that keeps its
//     connections alive keeps talking to the replica it first reached.
//   - A backend that turns unready gets no new connections, but the
//     connections it has keep flowing (as established flows do under
//     iptables or IPVS); they end when either side closes them.
//   - With no ready backend, a connection is reset at once, as a Service
//     without ready endpoints rejects it: the API server then reports the
//     webhook unreachable.
//   - Bytes pass through untouched: TLS is between the client and the
//     backend (the replicas share one certificate valid for 127.0.0.1).
//
// How it differs, so that nobody reads more into a test than it shows:
//   - Readiness is polled by the proxy itself (every 100 ms by default,
//     or as SetProbeInterval sets: each probe costs a backend a fresh
//     connection, which a benchmark of its CPU counts, and the kubelet
//     probes every few seconds; one failed probe takes a backend out, one
//     passed probe puts it back, like failureThreshold=1 and
//     successThreshold=1), where in a cluster
//     the kubelet probes, the endpoints controller publishes
//     EndpointSlices and kube-proxy reprograms the node: seconds, not
//     100 ms, pass there between a replica's failure and its removal from
//     rotation. A killed replica is noticed here much sooner.
//   - The choice is strict round robin over the ready backends (IPVS's
//     default); kube-proxy's iptables and nftables modes pick at random
//     with equal weights. Neither has session affinity here.
//   - The proxy accepts the connection and then dials the backend, so a
//     client sees a reset or an end of stream, not "connection refused",
//     when the chosen backend is gone before its probe fails. There is no
//     retry on another backend, as there is none with kube-proxy.
//   - Backends are added and removed by the caller (Add, Remove), which
//     stands in for the endpoints controller during a rollout: start the
//     replacement, Add it, then Remove and stop the old one.
//
// It must stay a test and development tool: no configuration from the
// cluster, no health of its own beyond Status, nothing vmipam imports.
package lbproxy
