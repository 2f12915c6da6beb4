#!/usr/bin/env bash
# Runs vmipam on a local control plane (etcd + kube-apiserver on loopback).
#
#   hack/local.sh run        start everything, apply the samples, show the VMs
#                            and pools, follow the logs; Ctrl-C tears it all down
#   hack/local.sh up         the same, left running in the background
#   hack/local.sh down       stop what 'up' started
#   hack/local.sh restart I  (REPLICAS > 1) stop replica I if it runs and start
#                            it again on its ports, under its holder name
#
# REPLICAS=N (default 1) runs N vmipam replicas (make local-up REPLICAS=3).
#
# VMIPAM_CONFIG=FILE runs vmipam with that kinds configuration
# (--kinds-config; see deploy/kinds): the control plane gets its kinds'
# webhook, admission policies and RBAC. VMIPAM_CRDS=PATH (a file or folder,
# optional) installs those kinds' CRDs at start; a CRD applied later is
# picked up too, vmipam waits for it.
#
# With REPLICAS=1 nothing changed: one vmipam on 127.0.0.1:9443 (webhook),
# :8443 (metrics, HTTPS with authorization) and :8081 (probes), holder
# "vmipam", pid and log in .local/vmipam.pid and .local/vmipam.log; no proxy.
#
# With REPLICAS=N > 1, replica I (from 0) runs with --holder=vmipam-I on
# webhook port 9444+I, plain-HTTP metrics on 8444+I (curl
# http://127.0.0.1:8444/metrics) and probes on 8082+I, pid and log in
# .local/vmipam-I.pid and .local/vmipam-I.log: kill one with
# `kill $(cat .local/vmipam-1.pid)` and bring it back with `hack/local.sh
# restart 1`. The webhook configurations still point at 127.0.0.1:9443,
# where hack/lbproxy listens (.local/lbproxy.pid, .local/lbproxy.log): a
# round-robin TCP proxy standing in for the Service, sending each new
# connection to a replica whose /readyz passes (polled every 100 ms). It is
# not kube-proxy (see test/lbproxy): it notices a dead replica in
# 100 ms where a cluster takes seconds, and like kube-proxy it balances
# connections, not requests, so the API server's kept-alive connections
# stay on the replica they reached. Its backends and connection counts:
# http://127.0.0.1:9442/status. Each replica keeps a Lease named after its
# holder; when one dies, the others take its addresses over once its lease
# lapses (docs/design.md, "Several holders").
#
# kube-controller-manager runs beside the API server (namespace deletion,
# garbage collection), and vmipam runs as its own ServiceAccount
# (.local/vmipam.kubeconfig, with the deployment's RBAC), not as the
# administrator of .local/kubeconfig, who is bound to cluster-admin but is
# not in system:masters: vmipam's admission policies hold for it.
#
# State lives in .local/ (kubeconfig at .local/kubeconfig, logs, pids).
set -euo pipefail
shopt -s nullglob

cd "$(dirname "$0")/.."
repo=$(pwd -P)
dir="${VMIPAM_LOCAL_DIR:-$repo/.local}"
config="${VMIPAM_CONFIG:-}"
if [ -n "$config" ]; then
	[ -f "$config" ] || { echo "VMIPAM_CONFIG=$config: no such file" >&2; exit 2; }
	config=$(realpath "$config")
fi
mode="${1:-run}"
kubeconfig="$dir/kubeconfig"
proxy_port=9443
proxy_status_port=9442

log() { printf 'local: %s\n' "$*" >&2; }

alive() { [ -f "$dir/$1.pid" ] && kill -0 "$(cat "$dir/$1.pid")" 2>/dev/null; }

# names lists what has a pid file: the proxy first, then the replicas, then
# the control plane, the order they are stopped in.
names() {
	local f n=()
	for f in "$dir/lbproxy.pid" "$dir"/vmipam.pid "$dir"/vmipam-*.pid; do
		[ -f "$f" ] && n+=("$(basename "$f" .pid)")
	done
	[ -f "$dir/localcluster.pid" ] && n+=(localcluster)
	echo "${n[@]}"
}

# stop NAME...: SIGTERM each one's process group at once (each was started
# with setsid, so etcd and kube-apiserver go with localcluster), wait up to
# 30s for all, then SIGKILL what is left.
stop() {
	local p pid pids=()
	for p in "$@"; do
		if alive "$p"; then
			pid=$(cat "$dir/$p.pid")
			kill -TERM -- "-$pid" 2>/dev/null || true
			pids+=("$pid")
		fi
		rm -f "$dir/$p.pid"
	done
	for _ in $(seq 1 300); do
		local left=0
		for pid in "${pids[@]}"; do kill -0 -- "-$pid" 2>/dev/null && left=1; done
		[ "$left" = 0 ] && break
		sleep 0.1
	done
	for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
	[ "${#pids[@]}" -gt 0 ]
}

down() {
	local all stopped=0 vmipams=()
	read -ra all <<<"$(names)"
	for p in "${all[@]}"; do [ "$p" != localcluster ] && vmipams+=("$p"); done
	# The replicas flush to the API server when they stop: before it goes.
	stop "${vmipams[@]}" && stopped=1
	stop localcluster && stopped=1
	rm -f "$kubeconfig" "$dir/vmipam.kubeconfig" "$dir/kube-controller-manager.kubeconfig" "$dir/ca.crt" "$dir/control-plane.ready" "$dir/replicas" "$dir/kinds-config"
	[ "$stopped" = 1 ] && log "stopped" || log "nothing was running"
}

# http_get PORT PATH: the response of a plain HTTP GET on 127.0.0.1, with
# no tool beyond bash.
http_get() {
	(exec 2>/dev/null 3<>"/dev/tcp/127.0.0.1/$1" && printf 'GET %s HTTP/1.0\r\n\r\n' "$2" >&3 && cat <&3)
}

# Replica I's name and ports; with one replica, today's single layout.
name_of() { if [ "$replicas" = 1 ]; then echo vmipam; else echo "vmipam-$1"; fi; }
webhook_port() { if [ "$replicas" = 1 ]; then echo 9443; else echo $((9444 + $1)); fi; }
metrics_port() { if [ "$replicas" = 1 ]; then echo 8443; else echo $((8444 + $1)); fi; }
probe_port() { if [ "$replicas" = 1 ]; then echo 8081; else echo $((8082 + $1)); fi; }

# vmipam_args I: replica I's command line, built here only.
vmipam_args() {
	local i=$1
	# vmipam's own ServiceAccount, with the RBAC a deployment grants it.
	args=(--kubeconfig "$dir/vmipam.kubeconfig" --namespace vmipam-system
		--webhook-host 127.0.0.1 --webhook-port "$(webhook_port "$i")" --webhook-extra-sans 127.0.0.1
		--metrics-bind-address "127.0.0.1:$(metrics_port "$i")"
		--health-probe-bind-address "127.0.0.1:$(probe_port "$i")"
		--resync-interval 1m --holder "$(name_of "$i")"
		# stop() waits 30s: no wait for the API server's idle connections.
		--shutdown-connection-wait 0s)
	if [ -n "$config" ]; then
		args+=(--kinds-config "$config")
	fi
	if [ "$replicas" -gt 1 ]; then
		args+=(--metrics-secure=false)
	fi
}

start_replica() {
	local i=$1 name
	name=$(name_of "$i")
	vmipam_args "$i"
	setsid bin/vmipam "${args[@]}" >>"$dir/$name.log" 2>&1 &
	echo $! >"$dir/$name.pid"
}

wait_replica() {
	local i=$1 name port out
	name=$(name_of "$i")
	port=$(probe_port "$i")
	for _ in $(seq 1 900); do
		if out=$(http_get "$port" /readyz) && [[ $out == *" 200 "* ]]; then
			return 0
		fi
		alive "$name" || { tail -n 50 "$dir/$name.log" >&2; log "$name exited"; exit 1; }
		sleep 0.1
	done
	log "$name not ready after 90s (log: $dir/$name.log)"
	exit 1
}

start_proxy() {
	local i backends=()
	for ((i = 0; i < replicas; i++)); do
		backends+=(--backend "vmipam-$i,127.0.0.1:$(webhook_port "$i"),http://127.0.0.1:$(probe_port "$i")/readyz")
	done
	setsid bin/lbproxy --listen "127.0.0.1:$proxy_port" --status-bind-address "127.0.0.1:$proxy_status_port" \
		"${backends[@]}" >"$dir/lbproxy.log" 2>&1 &
	echo $! >"$dir/lbproxy.pid"
}

# wait_proxy: until the proxy sees every replica ready.
wait_proxy() {
	local out
	for _ in $(seq 1 100); do
		if out=$(http_get "$proxy_status_port" /status) && [ "$(grep -cE '^vmipam-[0-9]+ +[^ ]+ +true ' <<<"$out")" = "$replicas" ]; then
			return 0
		fi
		alive lbproxy || { cat "$dir/lbproxy.log" >&2; log "the proxy exited"; exit 1; }
		sleep 0.1
	done
	log "the proxy does not see all $replicas replicas ready: $out"
	exit 1
}

if [ "$mode" = down ]; then
	down
	exit 0
fi

if [ "$mode" = restart ]; then
	i="${2:-}"
	replicas=$(cat "$dir/replicas" 2>/dev/null || echo 1)
	config=$(cat "$dir/kinds-config" 2>/dev/null || true)
	if [ "$replicas" = 1 ] || ! [[ $i =~ ^[0-9]+$ ]] || [ "$i" -ge "$replicas" ]; then
		log "usage: $0 restart I, with I a replica of a 'make local-up REPLICAS=N' (N > 1) that runs"
		exit 2
	fi
	stop "vmipam-$i" && log "stopped vmipam-$i"
	log "starting vmipam-$i"
	start_replica "$i"
	wait_replica "$i"
	log "vmipam-$i ready; the proxy sends it connections once its next probe passes"
	exit 0
fi
case "$mode" in run|up) ;; *) echo "usage: $0 run|up|down|restart I" >&2; exit 2 ;; esac

replicas="${REPLICAS:-1}"
if ! [[ $replicas =~ ^[0-9]+$ ]] || [ "$replicas" -lt 1 ] || [ "$replicas" -gt 20 ]; then
	log "REPLICAS=$replicas: want a number from 1 to 20"
	exit 2
fi

running=$(names)
for p in $running; do
	if alive "$p"; then
		log "a local vmipam is already running (kubeconfig: $kubeconfig); stop it with 'make local-down'"
		exit 1
	fi
done
ports=()
for ((i = 0; i < replicas; i++)); do
	ports+=("$(webhook_port "$i")" "$(metrics_port "$i")" "$(probe_port "$i")")
done
[ "$replicas" -gt 1 ] && ports+=("$proxy_port" "$proxy_status_port")
for port in "${ports[@]}"; do
	if (exec 2>/dev/null 3<>"/dev/tcp/127.0.0.1/$port"); then
		log "port $port on 127.0.0.1 is in use; stop what holds it first"
		exit 1
	fi
done
mkdir -p "$dir"
# Logs of an earlier run with another layout would read as this one's.
rm -f "$dir"/vmipam.log "$dir"/vmipam-*.log "$dir"/lbproxy.log
# kube-controller-manager too: namespace deletion and garbage collection.
assets=$(hack/envtest-assets.sh kube-controller-manager)
export KUBEBUILDER_ASSETS="$assets"
kubectl="$assets/kubectl"
log "building vmipam"
go build -o bin/vmipam ./cmd/vmipam
go build -o bin/localcluster ./hack/localcluster
[ "$replicas" -gt 1 ] && go build -o bin/lbproxy ./hack/lbproxy

if [ "$mode" = run ]; then
	trap 'down' EXIT
	trap 'exit 130' INT TERM
fi

log "starting the control plane"
cluster_args=(--dir "$dir" --repo "$repo")
[ -n "$config" ] && cluster_args+=(--kinds-config "$config")
[ -n "${VMIPAM_CRDS:-}" ] && cluster_args+=(--crd "$(realpath "$VMIPAM_CRDS")")
setsid bin/localcluster "${cluster_args[@]}" >"$dir/localcluster.log" 2>&1 &
echo $! >"$dir/localcluster.pid"
for _ in $(seq 1 600); do
	[ -f "$dir/control-plane.ready" ] && break
	alive localcluster || { cat "$dir/localcluster.log" >&2; log "the control plane failed to start"; exit 1; }
	sleep 0.1
done
[ -f "$dir/control-plane.ready" ] || { log "the control plane did not start in 60s"; exit 1; }

echo "$replicas" >"$dir/replicas"
echo "$config" >"$dir/kinds-config"
if [ "$replicas" = 1 ]; then
	log "starting vmipam"
else
	log "starting $replicas vmipam replicas behind the proxy on 127.0.0.1:$proxy_port"
	start_proxy
fi
for ((i = 0; i < replicas; i++)); do start_replica "$i"; done
for ((i = 0; i < replicas; i++)); do wait_replica "$i"; done
[ "$replicas" -gt 1 ] && wait_proxy

k() { "$kubectl" --kubeconfig "$kubeconfig" "$@"; }
log "applying the sample pool and virtual machines"
k apply -f deploy/samples/ippool.yaml
# The pool is served once vmipam has recovered it.
for _ in $(seq 1 100); do
	[ "$(k get ippools.vmipam.io -o jsonpath='{.items[*].status.conditions[?(@.type=="Ready")].status}')" = True ] && break
	sleep 0.1
done
if [ -n "$config" ] && ! bin/vmipam manifests --kinds-config "$config" | grep -q 'path: /mutate-vmipam-io-v1alpha1-virtualmachine$'; then
	log "$config does not serve vmipam's own VirtualMachine: no sample VMs; create objects of your kinds (their CRDs: VMIPAM_CRDS, or apply them now)"
	k get ippools.vmipam.io
	echo
elif ! k create -f deploy/samples/virtualmachines.yaml; then
	exit 1
else
	want=$(k get virtualmachines.vmipam.io -A --no-headers | wc -l)
	# Wait until the controller has bound them and the pool status shows it.
	for _ in $(seq 1 100); do
		[ "$(k get ippools.vmipam.io -o jsonpath='{.items[0].status.allocated}')" = "$want" ] && break
		sleep 0.1
	done
	echo
	k get virtualmachines.vmipam.io -A
	echo
	k get ippools.vmipam.io
	echo
fi
log "kubeconfig: $kubeconfig  (try: $kubectl --kubeconfig $kubeconfig get vmipam -A)"
if [ "$replicas" -gt 1 ]; then
	log "replicas: vmipam-0..vmipam-$((replicas - 1)), pids in $dir/vmipam-I.pid; proxy status: http://127.0.0.1:$proxy_status_port/status"
fi

if [ "$mode" = up ]; then
	log "running in the background; logs in $dir/*.log; stop with 'make local-down'"
	exit 0
fi
if [ "$replicas" = 1 ]; then
	log "following vmipam's logs; Ctrl-C stops everything"
	tail -n +1 -f "$dir/vmipam.log" &
	until=$(cat "$dir/vmipam.pid")
else
	# Killing a replica must not end the run: it lasts as long as the proxy.
	log "following the replicas' and the proxy's logs; Ctrl-C stops everything"
	tail -n +1 -f "$dir"/vmipam-*.log "$dir/lbproxy.log" &
	until=$(cat "$dir/lbproxy.pid")
fi
tailpid=$!
trap 'kill "$tailpid" 2>/dev/null; down' EXIT
wait "$until" || true
