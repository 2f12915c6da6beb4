#!/usr/bin/env bash
# make e2e: vmipam's image, a real single-node cluster (hack/e2e/cluster.sh),
# the Helm chart installed with that image (three replicas as Pods), the
# suite in test/e2e against the real Pods and Service, and a teardown that
# leaves the machine as it found it (checked). One run at a time: a second
# waits for the first's lock.
#
#   KEEP=1     leave the cluster up after the suite (hack/e2e/cluster.sh
#              exec kubectl get vmipam -A; hack/e2e/cluster.sh down ends it)
#   RUN=regex  run only the matching tests of the suite
#   HELM       the helm binary (the Makefile passes its pinned one)
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
repo_root="$(cd "${script_dir}/../.." && pwd -P)"
cd "${repo_root}"
DIR="${E2E_DIR:-/var/tmp/vmipam-e2e}"
export E2E_DIR="${DIR}"
HELM="${HELM:?HELM must name the helm binary}"
cluster="${script_dir}/cluster.sh"

log() { printf 'e2e: %s\n' "$*" >&2; }

# One lock for every cluster of this machine, whatever its folder: they
# would share the host's kernel settings and shared folders.
lock=/var/tmp/vmipam-e2e.lock
exec 8>"${lock}"
if ! flock -n 8; then
	log "another make e2e holds ${lock}; waiting for it..."
	flock 8
fi

start=${SECONDS}
assets="$(hack/envtest-assets.sh node)"
log "node binaries ready ($((SECONDS - start))s)"

# A cluster left by KEEP=1 or by a run that was killed goes first.
if [[ -e "${DIR}" || -e "/run/netns/${E2E_NETNS:-vmipam-e2e}" ]]; then
	log "removing the cluster an earlier run left"
	"${cluster}" down 8>&-
fi

work="$(mktemp -d /var/tmp/vmipam-e2e-build.XXXXXX)"
trap 'rm -rf "${work}"' EXIT
version="$(awk '/^appVersion:/ {gsub(/"/, "", $2); print $2}' deploy/chart/vmipam/Chart.yaml)"
go run ./hack/image -platforms "linux/$(go env GOARCH)" -out "${work}/image" >&2
# The suite's own Pod, which dials for it from inside the cluster.
go run ./hack/image -pkg ./test/e2e/probe -name e2e.local/probe -version test \
	-platforms "linux/$(go env GOARCH)" -out "${work}/probe-image" >&2
go test -c -o "${work}/e2e.test" ./test/e2e
log "image and suite built ($((SECONDS - start))s)"

finish() {
	local rc=$?
	rm -rf "${work}"
	if [[ -n "${KEEP:-}" ]]; then
		log "KEEP is set: the cluster stays up (hack/e2e/cluster.sh exec kubectl get pods -A; hack/e2e/cluster.sh down)"
	elif ! "${cluster}" down 8>&-; then
		rc=1
	fi
	exit "${rc}"
}
# Before up: a failed up leaves whatever it started.
trap finish EXIT
K8S_ASSETS="${assets}" "${cluster}" up 8>&-
"${cluster}" import "${work}/image/"*.oci.tar "${work}/probe-image/"*.oci.tar
log "cluster up ($((SECONDS - start))s)"

suite_start=${SECONDS}
status=0
# The suite's output is kept too, for the summary of its failures below:
# after a failure it dumps the Pods' logs, which bury the failure itself
# where only the end of the output is read.
out="$(mktemp /var/tmp/vmipam-e2e-out.XXXXXX)"
"${cluster}" exec env E2E_HELM="${HELM}" E2E_CHART="${repo_root}/deploy/chart/vmipam" \
	E2E_IMAGE="ghcr.io/vmipam/vmipam:${version}" E2E_KUBECTL="${assets}/kubectl" \
	E2E_REPO="${repo_root}" E2E_PROBE_IMAGE=e2e.local/probe:test \
	"${work}/e2e.test" -test.v -test.count=1 -test.timeout 40m ${RUN:+-test.run "${RUN}"} 2>&1 | tee "${out}" || status=$?
if ((status != 0)); then
	# Each failed test's last 40 lines before its FAIL line, and a setup's
	# failure (printed before any test runs).
	log "suite failed; what failed:"
	awk '/^=== (RUN|CONT|PAUSE)/ { n = 0 } { buf[n++ % 40] = $0 }
		/^ *--- FAIL/ { for (i = (n > 40 ? n - 40 : 0); i < n; i++) print buf[i % 40]; n = 0 }
		/^e2e setup:/ { setup = 1 } /^--- kubectl/ { setup = 0 } setup { print }
		/^(panic:|FAIL$)/ { print }' "${out}" >&2
fi
rm -f "${out}"
log "suite: exit ${status} in $((SECONDS - suite_start))s; make e2e so far $((SECONDS - start))s"
exit "${status}"
