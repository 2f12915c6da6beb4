#!/usr/bin/env bash
# Installs a Go command at a pinned version into the path given, building it
# once from the Go module proxy and caching the binary outside the
# repository, in
#
#   ${XDG_CACHE_HOME:-$HOME/.cache}/vmipam/tools/<name>-<version>
#
# so that a clean clone (CI) copies it instead of compiling it again: helm
# takes about 2.5 minutes to build on 2 cores, promtool about 7.
#
#   hack/go-tool.sh helm.sh/helm/v3/cmd/helm v3.22.0 bin/helm-v3.22.0
#
# Concurrent runs are serialised with flock(1); the binary is built under a
# temporary name and renamed into place, so an interrupted build leaves
# nothing half-written.
set -euo pipefail

if [[ $# -ne 3 ]]; then
	echo "usage: $0 <package> <version> <destination>" >&2
	exit 2
fi
pkg=$1 version=$2 dest=$3
name=${pkg##*/}
cache="${XDG_CACHE_HOME:-$HOME/.cache}/vmipam/tools"
cached="$cache/$name-$version"
mkdir -p "$cache" "$(dirname "$dest")"

exec 9>"$cache/.lock"
flock 9
if [[ ! -x $cached ]]; then
	echo "building $pkg@$version (once; cached in $cache)" >&2
	tmp=$(mktemp -d "$cache/.build.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	GOBIN="$tmp" "${GO:-go}" install "$pkg@$version"
	mv "$tmp/$name" "$cached"
fi
cp "$cached" "$dest.tmp"
mv "$dest.tmp" "$dest"
