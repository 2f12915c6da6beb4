#!/usr/bin/env bash
# Runs vmipam on a local control plane (etcd + kube-apiserver on loopback).
#
#   hack/local.sh run    start everything, apply the samples, show the VMs
#                        and pools, follow the logs; Ctrl-C tears it all down
#   hack/local.sh up     the same, left running in the background
#   hack/local.sh down   stop what 'up' started
#
# State lives in .local/ (kubeconfig at .local/kubeconfig, logs, pids).
set -euo pipefail

cd "$(dirname "$0")/.."
repo=$(pwd -P)
dir="${VMIPAM_LOCAL_DIR:-$repo/.local}"
mode="${1:-run}"
kubeconfig="$dir/kubeconfig"

log() { printf 'local: %s\n' "$*" >&2; }

alive() { [ -f "$dir/$1.pid" ] && kill -0 "$(cat "$dir/$1.pid")" 2>/dev/null; }

down() {
	local stopped=0
	for p in vmipam localcluster; do
		if alive "$p"; then
			local pid
			pid=$(cat "$dir/$p.pid")
			# Each was started with setsid: signal its whole process group,
			# so etcd and kube-apiserver go too.
			kill -TERM -- "-$pid" 2>/dev/null || true
			for _ in $(seq 1 300); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.1; done
			kill -KILL -- "-$pid" 2>/dev/null || true
			stopped=1
		fi
		rm -f "$dir/$p.pid"
	done
	rm -f "$kubeconfig" "$dir/control-plane.ready"
	[ "$stopped" = 1 ] && log "stopped" || log "nothing was running"
}

if [ "$mode" = down ]; then
	down
	exit 0
fi
case "$mode" in run|up) ;; *) echo "usage: $0 run|up|down" >&2; exit 2 ;; esac

if alive localcluster || alive vmipam; then
	log "a local vmipam is already running (kubeconfig: $kubeconfig); stop it with 'make local-down'"
	exit 1
fi
for port in 9443 8081 8443; do
	if (exec 2>/dev/null 3<>"/dev/tcp/127.0.0.1/$port"); then
		log "port $port on 127.0.0.1 is in use; stop what holds it first"
		exit 1
	fi
done
mkdir -p "$dir"
assets=$(hack/envtest-assets.sh)
export KUBEBUILDER_ASSETS="$assets"
kubectl="$assets/kubectl"
log "building vmipam"
go build -o bin/vmipam ./cmd/vmipam
go build -o bin/localcluster ./hack/localcluster

if [ "$mode" = run ]; then
	trap 'down' EXIT
	trap 'exit 130' INT TERM
fi

log "starting the control plane"
setsid bin/localcluster --dir "$dir" --repo "$repo" >"$dir/localcluster.log" 2>&1 &
echo $! >"$dir/localcluster.pid"
for _ in $(seq 1 600); do
	[ -f "$dir/control-plane.ready" ] && break
	alive localcluster || { cat "$dir/localcluster.log" >&2; log "the control plane failed to start"; exit 1; }
	sleep 0.1
done
[ -f "$dir/control-plane.ready" ] || { log "the control plane did not start in 60s"; exit 1; }

log "starting vmipam"
KUBECONFIG="$kubeconfig" setsid bin/vmipam \
	--namespace vmipam-system --webhook-host 127.0.0.1 --webhook-extra-sans 127.0.0.1 \
	--metrics-bind-address 127.0.0.1:8443 --health-probe-bind-address 127.0.0.1:8081 \
	--resync-interval 1m >"$dir/vmipam.log" 2>&1 &
echo $! >"$dir/vmipam.pid"
for _ in $(seq 1 600); do
	if out=$(exec 2>/dev/null 3<>/dev/tcp/127.0.0.1/8081 && printf 'GET /readyz HTTP/1.0\r\n\r\n' >&3 && cat <&3) && [[ $out == *" 200 "* ]]; then
		break
	fi
	alive vmipam || { cat "$dir/vmipam.log" >&2; log "vmipam exited"; exit 1; }
	sleep 0.1
done

k() { "$kubectl" --kubeconfig "$kubeconfig" "$@"; }
log "applying the sample pool and virtual machines"
k apply -f deploy/samples/ippool.yaml
# The pool is served once vmipam has recovered it.
for _ in $(seq 1 100); do
	[ "$(k get ippools -o jsonpath='{.items[*].status.conditions[?(@.type=="Ready")].status}')" = True ] && break
	sleep 0.1
done
k create -f deploy/samples/virtualmachines.yaml
want=$(grep -c '^kind: VirtualMachine' deploy/samples/virtualmachines.yaml)
# Wait until the controller has bound them and the pool status shows it.
for _ in $(seq 1 100); do
	[ "$(k get ippools -o jsonpath='{.items[0].status.allocated}')" = "$want" ] && break
	sleep 0.1
done
echo
k get virtualmachines -A
echo
k get ippools
echo
log "kubeconfig: $kubeconfig  (try: $kubectl --kubeconfig $kubeconfig get vm -A)"

if [ "$mode" = up ]; then
	log "running in the background; logs in $dir/*.log; stop with 'make local-down'"
	exit 0
fi
log "following vmipam's logs; Ctrl-C stops everything"
tail -n +1 -f "$dir/vmipam.log" &
tailpid=$!
trap 'kill "$tailpid" 2>/dev/null; down' EXIT
wait "$(cat "$dir/vmipam.pid")" || true
