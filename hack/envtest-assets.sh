#!/usr/bin/env bash
# Builds (once) and caches the control-plane binaries controller-runtime's
# envtest needs: kube-apiserver, etcd and kubectl. With the argument "node"
# it also builds what the real single-node cluster of `make e2e` runs:
# kubelet, kube-proxy, kube-controller-manager and kube-scheduler.
#
#   hack/envtest-assets.sh          # envtest's three
#   hack/envtest-assets.sh node     # those and the node's four
#   hack/envtest-assets.sh kube-controller-manager   # those and one more
#
# They are compiled from source fetched through the Go module proxy (no
# setup-envtest / GCS downloads needed), using the pinned tools modules in
# hack/k8s and hack/etcd. The binaries are cached outside the repository in
#
#   ${XDG_CACHE_HOME:-$HOME/.cache}/vmipam/k8s/v${K8S_VERSION}/
#
# so later runs reuse them. Progress goes to stderr; the only thing printed on
# stdout is that absolute directory, e.g.
#
#   export KUBEBUILDER_ASSETS="$(hack/envtest-assets.sh)"
#   KUBEBUILDER_ASSETS ?= $(shell hack/envtest-assets.sh)      # Makefile
#
# The first build takes several minutes (kube-apiserver is large); afterwards
# the script returns immediately. Concurrent invocations are serialised with
# flock(1) on a lock file in the cache directory, and every binary is built
# under a temporary name and renamed into place, so an interrupted build never
# leaves a truncated binary behind.
#
# Environment:
#   K8S_VERSION   Kubernetes version (default 1.37.2). Must match the version
#                 pinned in hack/k8s/go.mod.
#   ETCD_VERSION  etcd version (default 3.6.16). Must match the version pinned
#                 in hack/etcd/go.mod.
#   GO            go command to use (default: go).
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-3.6.16}"
GO="${GO:-go}"

K8S_VERSION="${K8S_VERSION#v}"
ETCD_VERSION="${ETCD_VERSION#v}"

log() { printf 'envtest-assets: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
repo_root="$(cd "${script_dir}/.." && pwd -P)"
cd "${repo_root}"

cache_root="${XDG_CACHE_HOME:-${HOME:?HOME is not set}/.cache}"
mkdir -p "${cache_root}"
cache_root="$(cd "${cache_root}" && pwd -P)"
cache_dir="${cache_root}/vmipam/k8s/v${K8S_VERSION}"

# Bump when the way the binaries are built changes (flags, ldflags, ...), to
# force a rebuild of existing caches.
recipe=1

binaries=(kube-apiserver kubectl etcd)
node_binaries=(kubelet kube-proxy kube-controller-manager kube-scheduler)
for arg in "$@"; do
	case "${arg}" in
	node) binaries+=("${node_binaries[@]}") ;;
	kubelet | kube-proxy | kube-controller-manager | kube-scheduler) binaries+=("${arg}") ;;
	*) die "unknown argument ${arg} (want node, or one of ${node_binaries[*]})" ;;
	esac
done

# stamp_for NAME -> the content NAME's stamp file must have to be up to date.
stamp_for() {
	case "$1" in
	kube-apiserver | kubectl | kubelet | kube-proxy | kube-controller-manager | kube-scheduler)
		echo "recipe=${recipe} k8s.io/kubernetes@v${K8S_VERSION}"
		;;
	etcd) echo "recipe=${recipe} go.etcd.io/etcd/server/v3@v${ETCD_VERSION}" ;;
	*) die "unknown binary $1" ;;
	esac
}

# up_to_date NAME -> success if the cached binary exists, is executable and
# was built for the requested version.
up_to_date() {
	local bin="${cache_dir}/$1" stamp="${cache_dir}/.$1.stamp"
	[[ -f "${bin}" && -x "${bin}" && -f "${stamp}" ]] || return 1
	[[ "$(<"${stamp}")" == "$(stamp_for "$1")" ]]
}

missing() {
	local name out=()
	for name in "${binaries[@]}"; do
		up_to_date "${name}" || out+=("${name}")
	done
	echo "${out[*]}"
}

# Fast path: everything is already there, no locking and no go invocation.
if [[ -z "$(missing)" ]]; then
	echo "${cache_dir}"
	exit 0
fi

# The tools modules are self-contained: never let a go.work elsewhere in the
# tree or a global GOFLAGS=-mod=vendor interfere. CGO is not needed by any of
# these binaries (upstream builds them statically as well).
export GOWORK=off CGO_ENABLED=0

# go_in DIR ARGS... runs go in a tools module, with all output on stderr.
go_in() {
	local dir="$1"
	shift
	(cd "${repo_root}/${dir}" && "${GO}" "$@") >&2
}

# mod_field DIR FORMAT MODULE -> go list -m -f FORMAT MODULE inside DIR.
mod_field() {
	(cd "${repo_root}/$1" && "${GO}" list -mod=readonly -m -f "$2" "$3")
}

# check_pin DIR MODULE VERSION: the tools module must pin exactly VERSION.
check_pin() {
	local pinned
	pinned="$(mod_field "$1" '{{.Version}}' "$2")" || die "cannot read $2 from $1/go.mod"
	[[ "${pinned}" == "$3" ]] ||
		die "$1/go.mod pins $2 ${pinned}, but $3 was requested; update $1/go.mod (and go.sum) or unset the version override"
}

# build NAME DIR PACKAGE LDFLAGS: go build PACKAGE in tools module DIR into the
# cache under a temporary name, then atomically rename it into place.
build() {
	local name="$1" dir="$2" pkg="$3" ldflags="$4"
	local dest="${cache_dir}/${name}"
	local tmp="${cache_dir}/.${name}.tmp.$$"
	local start=${SECONDS}
	tmp_files+=("${tmp}")
	log "building ${name} from ${pkg} (this can take several minutes the first time)..."
	go_in "${dir}" build -mod=readonly -trimpath -ldflags="-s -w ${ldflags}" -o "${tmp}" "${pkg}"
	chmod 0755 "${tmp}"
	mv -f -- "${tmp}" "${dest}"
	stamp_for "${name}" >"${cache_dir}/.${name}.stamp.tmp.$$"
	mv -f -- "${cache_dir}/.${name}.stamp.tmp.$$" "${cache_dir}/.${name}.stamp"
	log "built ${dest} in $((SECONDS - start))s"
}

# k8s_ldflags: the version information upstream's hack/lib/version.sh injects,
# so that `--version` and the /version endpoint report the real release.
k8s_ldflags() {
	local major minor build_date flags="" pkg kv key val
	major="${K8S_VERSION%%.*}"
	minor="${K8S_VERSION#*.}"
	minor="${minor%%.*}"
	# Commit time of the release tag, as recorded by the module proxy.
	build_date="$(mod_field hack/k8s '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' k8s.io/kubernetes)"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		for kv in "gitVersion=v${K8S_VERSION}" "gitMajor=${major}" "gitMinor=${minor}" \
			"gitTreeState=clean" "gitCommit=" "buildDate=${build_date:-1970-01-01T00:00:00Z}"; do
			key="${kv%%=*}"
			val="${kv#*=}"
			flags+=" -X ${pkg}.${key}=${val}"
		done
	done
	echo "${flags}"
}

command -v "${GO}" >/dev/null 2>&1 || die "'${GO}' not found in PATH"

# Refuse version overrides the tools modules do not pin, before touching the
# cache (otherwise we would silently build the pinned version instead).
todo="$(missing)"
if [[ " ${todo} " =~ " "(kube-|kubectl|kubelet) ]]; then
	check_pin hack/k8s k8s.io/kubernetes "v${K8S_VERSION}"
	# The staging modules are required as v0.0.0 and must be replaced.
	if [[ "$(mod_field hack/k8s '{{with .Replace}}{{.Version}}{{end}}' k8s.io/api)" != "v0.${K8S_VERSION#*.}" ]]; then
		die "hack/k8s/go.mod must replace the k8s.io staging modules with v0.${K8S_VERSION#*.}"
	fi
fi
if [[ " ${todo} " == *" etcd "* ]]; then
	check_pin hack/etcd go.etcd.io/etcd/server/v3 "v${ETCD_VERSION}"
fi

mkdir -p "${cache_dir}"
if command -v flock >/dev/null 2>&1; then
	exec 9>"${cache_dir}/.lock"
	if ! flock -n 9; then
		log "another invocation is building into ${cache_dir}; waiting for it..."
		flock 9
	fi
else
	log "warning: flock(1) not found; not serialising concurrent builds"
fi

tmp_files=()
cleanup() {
	local f
	for f in "${tmp_files[@]+"${tmp_files[@]}"}"; do
		rm -f -- "${f}"
	done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

todo="$(missing)" # re-check under the lock: a concurrent invocation may have built them.
if [[ -n "${todo}" ]]; then
	log "cache ${cache_dir} is missing/outdated: ${todo}"
	total_start=${SECONDS}
	for name in ${todo}; do
		case "${name}" in
		kube-apiserver | kubectl | kubelet | kube-proxy | kube-controller-manager | kube-scheduler)
			build "${name}" hack/k8s "k8s.io/kubernetes/cmd/${name}" "$(k8s_ldflags)"
			;;
		etcd)
			build etcd hack/etcd go.etcd.io/etcd/server/v3 "-X go.etcd.io/etcd/api/v3/version.GitSHA=v${ETCD_VERSION}"
			;;
		esac
	done
	log "done in $((SECONDS - total_start))s"
fi

[[ -z "$(missing)" ]] || die "binaries still missing after build: $(missing)"
echo "${cache_dir}"
