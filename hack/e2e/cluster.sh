#!/usr/bin/env bash
# A real single-node Kubernetes cluster on this machine, with no container
# engine, no registry and no route out: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, containerd (with runc and the
# CNI bridge), kubelet and kube-proxy, every one of them in a network
# namespace of its own that has no interface leading out of the machine.
#
#   hack/e2e/cluster.sh up      start it (the binaries from hack/envtest-assets.sh node)
#   hack/e2e/cluster.sh down    stop it and remove every trace of it
#   hack/e2e/cluster.sh check   exit 1 if a trace of it is left: processes,
#                               mounts, cgroups, the namespace, its folder, or
#                               a change to the host's iptables rules, to the
#                               sysctls kubelet sets or to the folders
#                               containerd and libcni share (/run/containerd,
#                               /var/lib/cni), against what up recorded
#   hack/e2e/cluster.sh exec CMD...   run CMD inside the cluster's network
#                               namespace with KUBECONFIG set (kubectl, helm)
#   hack/e2e/cluster.sh import ARCHIVE...   import OCI archives into the node
#
# The network namespace (vmipam-e2e) holds the node's address on a veth
# pair whose both ends stay inside it, the CNI bridge and the Pods' veths;
# it has no default route, so a packet to any address outside it (a Pod's
# to the internet, or to a ClusterIP kube-proxy has not programmed yet) is
# refused with "network unreachable" and never leaves. The host reaches
# the cluster only through `exec`. Only the network namespace is entered
# (nsenter --net): kubelet and containerd must see each other's mounts.
#
# Everything else lives under E2E_DIR (default /var/tmp/vmipam-e2e): the
# PKI, kubeconfigs, etcd's data, containerd's root and state, kubelet's
# root, logs. Kubelet's Pods go into the cgroup /vmipam-e2e of each
# controller. Kubelet sets a few kernel-wide sysctls; `up` records them and
# `down` puts them back.
#
# Environment: E2E_DIR, K8S_ASSETS (the binaries' folder; default: built
# by hack/envtest-assets.sh node), E2E_NETNS (default vmipam-e2e).
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
repo_root="$(cd "${script_dir}/../.." && pwd -P)"
DIR="${E2E_DIR:-/var/tmp/vmipam-e2e}"
NETNS="${E2E_NETNS:-vmipam-e2e}"
NODE=e2e-node
NODE_IP=10.250.0.1
POD_CIDR=10.244.0.0/24
CLUSTER_CIDR=10.244.0.0/16
SERVICE_CIDR=10.96.0.0/16
API_SERVICE_IP=10.96.0.1
# Named after the namespace, so that clusters of other names do not
# share them.
CGROUP_ROOT="${NETNS}"
CNI_NETWORK="${NETNS}"
PAUSE_IMAGE=registry.k8s.io/pause:3.10
# The kernel-wide sysctls kubelet sets (setupKernelTunables) and kube-proxy
# might; they are put back by down.
# (kube-proxy is told to leave net/netfilter/nf_conntrack_max alone.)
HOST_SYSCTLS=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes)
# Folders outside DIR that kubelet, containerd, libcni and ip write to
# whatever their configuration: up records which exist, down removes those
# that did not (once empty of this cluster's files).
SHARED_DIRS=(/var/lib/cni/results /var/lib/cni /run/containerd/s /run/containerd /var/log/containers /var/log/pods /var/lib/kubelet/device-plugins /var/lib/kubelet /run/netns)
# A file in DIR that marks it as a cluster's: down deletes nothing without it.
MARKER=.vmipam-e2e-cluster

log() { printf 'e2e-cluster: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

in_ns() { nsenter --net="/run/netns/${NETNS}" -- "$@"; }

assets() {
	if [[ -n "${K8S_ASSETS:-}" ]]; then
		echo "${K8S_ASSETS}"
	else
		"${repo_root}/hack/envtest-assets.sh" node
	fi
}

need() {
	local missing=() c
	for c in "$@"; do
		command -v "${c}" >/dev/null 2>&1 || missing+=("${c}")
	done
	((${#missing[@]} == 0)) || die "missing commands: ${missing[*]} (Debian: apt-get install containerd runc containernetworking-plugins iptables iproute2 procps openssl util-linux)"
}

# preflight: what this script needs of the machine, checked before it
# changes anything.
preflight() {
	need containerd runc ctr iptables ip openssl nsenter sysctl
	((EUID == 0)) || die "run as root: kubelet, containerd and the network namespace need it"
	if [[ "$(stat -fc %T /sys/fs/cgroup)" == cgroup2fs ]]; then
		die "cgroup v2 (unified) hosts are not supported yet: this cluster drives v1 controllers with kubelet's cgroupfs driver"
	fi
	if [[ ! -d /proc/sys/net/bridge ]]; then
		command -v modprobe >/dev/null 2>&1 && modprobe br_netfilter 2>/dev/null || true
		[[ -d /proc/sys/net/bridge ]] || die "no /proc/sys/net/bridge: load br_netfilter (modprobe br_netfilter); kube-proxy's rules must see bridged traffic"
	fi
}

# ---------------------------------------------------------------- PKI

# cert NAME CN O [SANS]: a key and certificate signed by the cluster's CA.
cert() {
	local name="$1" cn="$2" o="$3" sans="${4:-}" ext="${DIR}/pki/${1}.ext"
	local subj="/CN=${cn}"
	[[ -n "${o}" ]] && subj="/O=${o}${subj}"
	{
		echo "basicConstraints=CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		if [[ -n "${sans}" ]]; then
			echo "extendedKeyUsage=serverAuth,clientAuth"
			echo "subjectAltName=${sans}"
		else
			echo "extendedKeyUsage=clientAuth"
		fi
	} >"${ext}"
	openssl req -new -newkey rsa:2048 -nodes -keyout "${DIR}/pki/${name}.key" -subj "${subj}" \
		-out "${DIR}/pki/${name}.csr" 2>/dev/null
	openssl x509 -req -in "${DIR}/pki/${name}.csr" -CA "${DIR}/pki/ca.crt" -CAkey "${DIR}/pki/ca.key" \
		-CAcreateserial -days 2 -sha256 -extfile "${ext}" -out "${DIR}/pki/${name}.crt" 2>/dev/null
}

# kubeconfig NAME CERT: a kubeconfig for the API server with CERT's identity.
kubeconfig() {
	cat >"${DIR}/${1}.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    certificate-authority: ${DIR}/pki/ca.crt
    server: https://${NODE_IP}:6443
users:
- name: ${2}
  user:
    client-certificate: ${DIR}/pki/${2}.crt
    client-key: ${DIR}/pki/${2}.key
contexts:
- name: e2e
  context: {cluster: e2e, user: ${2}}
current-context: e2e
EOF
}

pki() {
	mkdir -p "${DIR}/pki"
	openssl req -x509 -new -newkey rsa:2048 -nodes -keyout "${DIR}/pki/ca.key" -subj "/CN=vmipam-e2e-ca" \
		-days 2 -sha256 -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
		-out "${DIR}/pki/ca.crt" 2>/dev/null
	cert apiserver kube-apiserver "" "IP:${NODE_IP},IP:${API_SERVICE_IP},IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
	cert kubelet-serving "${NODE}" "" "IP:${NODE_IP},DNS:${NODE}"
	cert admin kubernetes-admin system:masters
	cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
	cert kubelet "system:node:${NODE}" system:nodes
	cert controller-manager system:kube-controller-manager ""
	cert scheduler system:kube-scheduler ""
	cert proxy system:kube-proxy ""
	openssl genrsa -out "${DIR}/pki/sa.key" 2048 2>/dev/null
	openssl rsa -in "${DIR}/pki/sa.key" -pubout -out "${DIR}/pki/sa.pub" 2>/dev/null
	kubeconfig admin admin
	kubeconfig kubelet kubelet
	kubeconfig controller-manager controller-manager
	kubeconfig scheduler scheduler
	kubeconfig proxy proxy
}

# ---------------------------------------------------------------- processes

# start NAME ARGS...: run a component inside the namespace, logging to
# logs/NAME.log, and record its PID.
start() {
	local name="$1"
	shift
	# No descriptor beyond the standard three: the components outlive
	# this script, and must not hold a caller's lock.
	setsid nsenter --net="/run/netns/${NETNS}" -- "$@" </dev/null >"${DIR}/logs/${name}.log" 2>&1 8>&- 9>&- &
	echo $! >"${DIR}/pids/${name}"
}

# dead: the first component that has exited, if any.
dead() {
	local f
	for f in "${DIR}/pids/"*; do
		[[ -f "${f}" ]] || continue
		kill -0 "$(cat "${f}")" 2>/dev/null || {
			basename "${f}"
			return
		}
	done
}

# wait_for WHAT SECONDS CMD...: retry CMD until it succeeds; fail at once
# when a component has exited.
wait_for() {
	local what="$1" secs="$2" i gone
	shift 2
	for ((i = 0; i < secs * 5; i++)); do
		if "$@" >/dev/null 2>&1; then
			return 0
		fi
		gone="$(dead)"
		if [[ -n "${gone}" ]]; then
			tail -n 20 "${DIR}/logs/${gone}.log" >&2
			die "${gone} exited while waiting for ${what}; its log: ${DIR}/logs/${gone}.log"
		fi
		sleep 0.2
	done
	die "${what} not ready after ${secs}s; see ${DIR}/logs"
}

kubectl_() { in_ns "${ASSETS}/kubectl" --kubeconfig "${DIR}/admin.kubeconfig" "$@"; }

network() {
	ip netns add "${NETNS}"
	in_ns ip link set lo up
	in_ns ip link add e2e-node type veth peer name e2e-node-peer
	in_ns ip addr add "${NODE_IP}/24" dev e2e-node
	in_ns ip link set e2e-node up
	in_ns ip link set e2e-node-peer up
	# The Service range leads to the node's veth, whose other end is in
	# here too and forwards nothing: a locally sent packet needs a route
	# before kube-proxy's OUTPUT rules can rewrite it, and one to a
	# ClusterIP not programmed yet ends at that end.
	in_ns ip route add "${SERVICE_CIDR}" dev e2e-node
	# Per namespace: forwarding between the bridge and the node, and the
	# bridge's traffic through iptables (kube-proxy's rules).
	ip netns exec "${NETNS}" sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
	if in_ns ip route show default | grep -q .; then
		die "the namespace ${NETNS} has a default route"
	fi
}

containerd_config() {
	mkdir -p "${DIR}/cni/conf" "${DIR}/cni/ipam" "${DIR}/containerd"
	cat >"${DIR}/cni/conf/10-e2e.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "${CNI_NETWORK}",
  "plugins": [{
    "type": "bridge",
    "bridge": "e2e-cni0",
    "isGateway": true,
    "ipMasq": false,
    "hairpinMode": true,
    "ipam": {
      "type": "host-local",
      "dataDir": "${DIR}/cni/ipam",
      "ranges": [[{"subnet": "${POD_CIDR}"}]],
      "routes": [{"dst": "0.0.0.0/0"}]
    }
  }]
}
EOF
	local cni_bin
	for cni_bin in /usr/lib/cni /opt/cni/bin; do
		[[ -x "${cni_bin}/bridge" && -x "${cni_bin}/host-local" ]] && break
	done
	[[ -x "${cni_bin}/bridge" ]] || die "no CNI bridge plugin (apt-get install containernetworking-plugins)"
	cat >"${DIR}/containerd/config.toml" <<EOF
version = 2
root = "${DIR}/containerd/root"
state = "${DIR}/containerd/state"
[plugins."io.containerd.internal.v1.opt"]
  path = "${DIR}/containerd/opt"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "${DIR}/containerd/containerd.sock"
[ttrpc]
  address = "${DIR}/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "${PAUSE_IMAGE}"
  # No CAP_SYS_RESOURCE here: without this every sandbox fails with
  # "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "${DIR}/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "${cni_bin}"
    conf_dir = "${DIR}/cni/conf"
EOF
}

kubelet_config() {
	: >"${DIR}/resolv.conf"
	cat >"${DIR}/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroups are v1 (hybrid) here, driven by kubelet itself.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /${CGROUP_ROOT}
failSwapOn: false
containerRuntimeEndpoint: unix://${DIR}/containerd/containerd.sock
address: ${NODE_IP}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: ${DIR}/pki/kubelet-serving.crt
tlsPrivateKeyFile: ${DIR}/pki/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: ${DIR}/pki/ca.crt}
authorization:
  mode: Webhook
resolvConf: ${DIR}/resolv.conf
# Images are imported, never pulled: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
evictionPressureTransitionPeriod: 5s
serializeImagePulls: false
maxPods: 60
nodeStatusReportFrequency: 10s
syncFrequency: 10s
fileCheckFrequency: 10s
EOF
}

proxy_config() {
	cat >"${DIR}/proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: ${DIR}/proxy.kubeconfig
mode: iptables
clusterCIDR: ${CLUSTER_CIDR}
hostnameOverride: ${NODE}
bindAddress: ${NODE_IP}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# Leave the kernel-wide conntrack table alone.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  syncPeriod: 10s
  minSyncPeriod: 0s
EOF
}

save_sysctls() {
	local s
	: >"${DIR}/host-sysctls"
	for s in "${HOST_SYSCTLS[@]}"; do
		[[ -r "/proc/sys/${s}" ]] && printf '%s %s\n' "${s}" "$(tr '\t' ' ' <"/proc/sys/${s}")" >>"${DIR}/host-sysctls"
	done
	return 0
}

# cgroups: kubelet's root cgroup, in every v1 controller hierarchy (a
# cpuset needs its CPUs and memory nodes before tasks can join it).
cgroups() {
	local c
	for c in /sys/fs/cgroup/*/; do
		[[ -d "${c}" && "${c}" != */unified/ ]] || continue
		mkdir -p "${c}${CGROUP_ROOT}"
		if [[ -f "${c}cpuset.cpus" ]]; then
			cat "${c}cpuset.cpus" >"${c}${CGROUP_ROOT}/cpuset.cpus"
			cat "${c}cpuset.mems" >"${c}${CGROUP_ROOT}/cpuset.mems"
		fi
	done
}

import_images() {
	local a
	for a in "$@"; do
		in_ns ctr --address "${DIR}/containerd/containerd.sock" -n k8s.io images import --no-unpack=false "${a}" >&2 ||
			die "import ${a}"
	done
}

up() {
	preflight
	[[ ! -e "/run/netns/${NETNS}" ]] || die "the namespace ${NETNS} exists: a cluster is up (hack/e2e/cluster.sh down)"
	[[ ! -e "${DIR}" ]] || die "${DIR} exists: hack/e2e/cluster.sh down first (or another E2E_DIR)"
	ASSETS="$(assets)"
	local start_time=${SECONDS}
	[[ -f "${BASELINE}" ]] || host_state >"${BASELINE}"
	ls /run/containerd/s 2>/dev/null >"${BASELINE}.sockets" || true
	ls /var/log/containers 2>/dev/null >"${BASELINE}.links" || true
	ls /var/log/pods 2>/dev/null >"${BASELINE}.podlogs" || true
	mkdir -p "${DIR}/logs" "${DIR}/pids"
	: >"${DIR}/${MARKER}"
	echo "${ASSETS}" >"${DIR}/assets"
	save_sysctls
	pki
	containerd_config
	kubelet_config
	proxy_config
	network
	cgroups

	start etcd "${ASSETS}/etcd" --data-dir "${DIR}/etcd" --listen-client-urls http://127.0.0.1:2379 \
		--advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 \
		--unsafe-no-fsync --quota-backend-bytes 4294967296 --max-request-bytes 10485760
	start kube-apiserver "${ASSETS}/kube-apiserver" --etcd-servers http://127.0.0.1:2379 \
		--bind-address 0.0.0.0 --secure-port 6443 --advertise-address "${NODE_IP}" \
		--service-cluster-ip-range "${SERVICE_CIDR}" \
		--tls-cert-file "${DIR}/pki/apiserver.crt" --tls-private-key-file "${DIR}/pki/apiserver.key" \
		--client-ca-file "${DIR}/pki/ca.crt" \
		--service-account-issuer https://kubernetes.default.svc.cluster.local \
		--service-account-key-file "${DIR}/pki/sa.pub" --service-account-signing-key-file "${DIR}/pki/sa.key" \
		--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
		--kubelet-client-certificate "${DIR}/pki/apiserver-kubelet-client.crt" \
		--kubelet-client-key "${DIR}/pki/apiserver-kubelet-client.key" \
		--kubelet-certificate-authority "${DIR}/pki/ca.crt" \
		--kubelet-preferred-address-types InternalIP \
		--allow-privileged=false --profiling=false
	wait_for kube-apiserver 60 kubectl_ get --raw /readyz
	start kube-controller-manager "${ASSETS}/kube-controller-manager" \
		--kubeconfig "${DIR}/controller-manager.kubeconfig" \
		--authentication-kubeconfig "${DIR}/controller-manager.kubeconfig" \
		--authorization-kubeconfig "${DIR}/controller-manager.kubeconfig" \
		--service-account-private-key-file "${DIR}/pki/sa.key" --root-ca-file "${DIR}/pki/ca.crt" \
		--use-service-account-credentials --leader-elect=false --bind-address 127.0.0.1 \
		--cluster-signing-cert-file "${DIR}/pki/ca.crt" --cluster-signing-key-file "${DIR}/pki/ca.key"
	start kube-scheduler "${ASSETS}/kube-scheduler" --kubeconfig "${DIR}/scheduler.kubeconfig" \
		--authentication-kubeconfig "${DIR}/scheduler.kubeconfig" \
		--authorization-kubeconfig "${DIR}/scheduler.kubeconfig" \
		--leader-elect=false --bind-address 127.0.0.1
	start containerd containerd --config "${DIR}/containerd/config.toml"
	wait_for containerd 30 in_ns ctr --address "${DIR}/containerd/containerd.sock" version
	build_pause
	import_images "${DIR}/pause.oci.tar"
	start kubelet "${ASSETS}/kubelet" --config "${DIR}/kubelet.yaml" --kubeconfig "${DIR}/kubelet.kubeconfig" \
		--root-dir "${DIR}/kubelet" --cert-dir "${DIR}/kubelet/pki" \
		--node-ip "${NODE_IP}" --hostname-override "${NODE}"
	start kube-proxy "${ASSETS}/kube-proxy" --config "${DIR}/proxy.yaml"
	wait_for "node ${NODE}" 90 kubectl_ wait --for condition=Ready "node/${NODE}" --timeout 1s
	wait_for "the default ServiceAccount" 60 kubectl_ get serviceaccount default
	log "up in $((SECONDS - start_time))s: hack/e2e/cluster.sh exec kubectl get nodes"
}

build_pause() {
	(cd "${repo_root}" && go run ./hack/image -pkg ./hack/pause -name "${PAUSE_IMAGE%:*}" -version "${PAUSE_IMAGE##*:}" \
		-platforms "linux/$(go env GOARCH)" -out "${DIR}/pause-image") >/dev/null
	cp "${DIR}/pause-image/"*.oci.tar "${DIR}/pause.oci.tar"
}

# ---------------------------------------------------------------- teardown

# pids_of_dir: processes whose command line names DIR (the components,
# containerd's shims), and those inside Pods' cgroups.
pids_of_dir() {
	{
		# The pattern from a file: grep's own command line must not match.
		grep -alF -f <(printf '%s\n' "${DIR}/") /proc/[0-9]*/cmdline 2>/dev/null
		grep -lE -- ":/${CGROUP_ROOT}(/|$)" /proc/[0-9]*/cgroup 2>/dev/null
	} | awk -F/ '{print $3}' | sort -u | grep -vx -e "$$" -e "${BASHPID}" || true
}

# stop_component NAME: SIGTERM to the component NAME started, if that PID
# still runs it (a PID from before a reboot may be another process's now).
stop_component() {
	local f="${DIR}/pids/$1" pid
	[[ -f "${f}" ]] || return 0
	pid="$(cat "${f}")"
	grep -qaF -- "${DIR}/" "/proc/${pid}/cmdline" 2>/dev/null && kill "${pid}" 2>/dev/null
	return 0
}

mounts_under_dir() { awk -v d="${DIR}/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r; }

cgroup_dirs() {
	local c
	for c in /sys/fs/cgroup/*/; do
		[[ -d "${c}${CGROUP_ROOT}" ]] && echo "${c}${CGROUP_ROOT}"
	done
	return 0
}

# baseline: what teardown must find again, written beside DIR by up.
BASELINE="${DIR%/}.baseline"

# host_state prints what of the host the cluster could touch outside its
# folder: the host namespace's iptables rules (without counters), the
# kernel-wide sysctls kubelet sets, and the shared folders containerd and
# libcni write to.
host_state() {
	local s
	for t in iptables ip6tables; do
		echo "# ${t}"
		"${t}-save" 2>/dev/null | sed -E '/^#/d; s/\[[0-9]+:[0-9]+\]//' || true
	done
	for s in "${HOST_SYSCTLS[@]}"; do
		[[ -r "/proc/sys/${s}" ]] && echo "${s} $(tr '\t' ' ' <"/proc/sys/${s}")"
	done
	for s in "${SHARED_DIRS[@]}"; do
		[[ -e "${s}" ]] && echo "exists ${s} $(find "${s}" -mindepth 1 -maxdepth 1 | wc -l)"
	done
	mountpoint -q /run/netns 2>/dev/null && echo "mounted /run/netns"
	return 0
}

# stale_leftovers removes what containerd, libcni and kubelet left outside
# DIR for containers that did not stop through them: libcni's cached results of
# this cluster's network (and the loopback entries of the same sandboxes),
# and shim sockets no process listens on any more.
stale_leftovers() {
	local f id
	for f in "/var/lib/cni/results/${CNI_NETWORK}-"*; do
		[[ -e "${f}" ]] || continue
		id="${f#/var/lib/cni/results/"${CNI_NETWORK}"-}"
		id="${id%-eth0}"
		rm -f -- "${f}" "/var/lib/cni/results/cni-loopback-${id}-lo"
	done
	# Shim sockets that were not there before up and that no process
	# listens on.
	for f in /run/containerd/s/*; do
		[[ -S "${f}" ]] || continue
		grep -qxF -- "${f##*/}" "${BASELINE}.sockets" 2>/dev/null && continue
		grep -qF -- " ${f}" /proc/net/unix || rm -f -- "${f}"
	done
	# kubelet's containers' logs and its links to them (both in folders
	# of their own whatever its configuration says): those that were not
	# there before up. And its device plugin socket.
	for f in /var/log/containers/*; do
		[[ -L "${f}" ]] || continue
		grep -qxF -- "${f##*/}" "${BASELINE}.links" 2>/dev/null || rm -f -- "${f}"
	done
	for f in /var/log/pods/*_*_*; do
		[[ -d "${f}" ]] || continue
		grep -qxF -- "${f##*/}" "${BASELINE}.podlogs" 2>/dev/null || rm -rf -- "${f}"
	done
	rm -f /var/lib/kubelet/device-plugins/kubelet.sock
	# Folders only this cluster made, now empty.
	if [[ -f "${BASELINE}" ]]; then
		if ! grep -q "^mounted /run/netns" "${BASELINE}" && mountpoint -q /run/netns 2>/dev/null &&
			[[ -z "$(ls -A /run/netns)" ]]; then
			umount /run/netns 2>/dev/null || true
		fi
		for f in "${SHARED_DIRS[@]}"; do
			grep -q "^exists ${f} " "${BASELINE}" || rmdir -- "${f}" 2>/dev/null || true
		done
	fi
}

down() {
	local p i down_start=${SECONDS}
	if [[ -e "${DIR}" && ! -e "${DIR}/${MARKER}" ]]; then
		die "${DIR} is not a cluster's folder (no ${MARKER}): not touching it"
	fi
	if [[ -f "${DIR}/assets" && -S "${DIR}/containerd/containerd.sock" ]]; then
		# kubelet and kube-proxy first; the containers they leave running
		# are killed below, and what containerd and libcni keep of them
		# outside DIR is removed by stale_leftovers.
		for p in kube-proxy kubelet; do
			stop_component "${p}"
		done
	fi
	if [[ -d "${DIR}/runc" ]]; then
		for i in $(runc --root "${DIR}/runc/k8s.io" list -q 2>/dev/null); do
			runc --root "${DIR}/runc/k8s.io" kill -a "${i}" KILL 2>/dev/null || true
		done
	fi
	for p in kube-scheduler kube-controller-manager kube-apiserver containerd etcd; do
		stop_component "${p}"
	done
	for ((i = 0; i < 50; i++)); do
		[[ -z "$(pids_of_dir)" ]] && break
		sleep 0.2
	done
	for p in $(pids_of_dir); do
		kill -KILL "${p}" 2>/dev/null || true
	done
	for ((i = 0; i < 25; i++)); do
		[[ -z "$(pids_of_dir)" ]] && break
		sleep 0.2
	done
	if [[ -d "${DIR}/runc" ]]; then
		for i in $(runc --root "${DIR}/runc/k8s.io" list -q 2>/dev/null); do
			runc --root "${DIR}/runc/k8s.io" delete -f "${i}" 2>/dev/null || true
		done
	fi
	for p in $(mounts_under_dir); do
		umount "${p}" 2>/dev/null || umount -l "${p}" 2>/dev/null || true
	done
	for p in $(cgroup_dirs); do
		# Depth first: a cgroup goes once its children have.
		find "${p}" -depth -type d -exec rmdir {} + 2>/dev/null || true
	done
	[[ -e "/run/netns/${NETNS}" ]] && ip netns del "${NETNS}"
	if [[ -f "${DIR}/host-sysctls" ]]; then
		while read -r s v; do
			echo "${v}" >"/proc/sys/${s}" 2>/dev/null || log "could not restore ${s} to ${v}"
		done <"${DIR}/host-sysctls"
	fi
	if [[ -n "$(mounts_under_dir)" ]]; then
		die "mounts left under ${DIR}: $(mounts_under_dir | tr '\n' ' ')"
	fi
	rm -rf "${DIR}"
	stale_leftovers
	log "down in $((SECONDS - down_start))s"
	check
}

check() {
	local bad=() s v
	[[ -z "$(pids_of_dir)" ]] || bad+=("processes $(pids_of_dir | tr '\n' ' ')")
	[[ -z "$(mounts_under_dir)" ]] || bad+=("mounts $(mounts_under_dir | tr '\n' ' ')")
	[[ -z "$(cgroup_dirs)" ]] || bad+=("cgroups $(cgroup_dirs | tr '\n' ' ')")
	[[ ! -e "/run/netns/${NETNS}" ]] || bad+=("the network namespace ${NETNS}")
	[[ ! -e "${DIR}" ]] || bad+=("the folder ${DIR}")
	if [[ -f "${BASELINE}" ]]; then
		if ! diff <(cat "${BASELINE}") <(host_state) >"${BASELINE}.diff"; then
			bad+=("host changes (${BASELINE}.diff): $(head -c 2000 "${BASELINE}.diff")")
		else
			rm -f "${BASELINE}" "${BASELINE}.diff" "${BASELINE}.sockets" "${BASELINE}.links" "${BASELINE}.podlogs"
		fi
	fi
	if ((${#bad[@]} > 0)); then
		log "left behind: ${bad[*]}"
		return 1
	fi
	log "nothing left behind"
}

case "${1:-}" in
up) up ;;
down) down ;;
check) check ;;
exec)
	shift
	[[ -e "/run/netns/${NETNS}" ]] || die "no cluster is up"
	ASSETS="$(cat "${DIR}/assets")"
	KUBECONFIG="${DIR}/admin.kubeconfig" PATH="${ASSETS}:${PATH}" in_ns "$@"
	;;
import)
	shift
	import_images "$@"
	;;
*) die "usage: $0 up|down|check|exec CMD...|import ARCHIVE..." ;;
esac
