#!/usr/bin/env bash
# build.sh: build the sandbox's cluster commands from the pinned tools
# module into $E2E_CACHE/bin/NAME-VERSION, only when that file is missing
# (the first kube-apiserver build takes ~12 minutes on 2 cores, so it is
# cached). etcd is etcd's own server at the version Kubernetes pins.
#
# The cache lives outside the checkout (default: the user's cache folder,
# ~/.cache/ipvsproxy-e2e), so a fresh clone on the same machine — CI's
# case — finds the binaries the last one built. NAME-VERSION is the key:
# a version bump in go.mod builds anew.
#
#   e2e/tools/build.sh [kube-apiserver] [kube-proxy] [etcd] ...
#
# Prints the path of each binary, one a line. CGO is off so the binaries
# are static and run inside the user-mode-Linux guest.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${E2E_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/ipvsproxy-e2e}
# module_version MODULE: the version go.mod requires of MODULE.
module_version() {
  grep -o "$1 v[0-9.]*" "$here/go.mod" | head -1 | cut -d' ' -f2
}
[ $# -gt 0 ] || set -- kube-apiserver
mkdir -p "$cache/bin"
for name in "$@"; do
  case "$name" in
    # the commands tools.go pins in go.sum
    kube-apiserver|kube-proxy) pkg=k8s.io/kubernetes/cmd/$name version=$(module_version k8s.io/kubernetes) ;;
    etcd) pkg=./cmd/etcd version=$(module_version go.etcd.io/etcd/server/v3) ;;
    *) echo "build.sh: unknown command $name" >&2; exit 2 ;;
  esac
  [ -n "$version" ] || { echo "build.sh: no version for $name in $here/go.mod" >&2; exit 2; }
  out="$cache/bin/$name-$version"
  if [ ! -x "$out" ]; then
    echo "build.sh: building $name $version (cached at $out)" >&2
    start=$(date +%s)
    # Build to a temporary name of this process's first: an interrupted
    # build must not leave a half-written binary that a later run would
    # take as cached, and two checkouts building at once must not write
    # the same file (the cache is shared).
    (cd "$here" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' \
      -o "$out.tmp.$$" "$pkg")
    mv -f "$out.tmp.$$" "$out"
    echo "build.sh: $name built in $(( $(date +%s) - start ))s" >&2
  fi
  (cd "$(dirname "$out")" && echo "$PWD/$(basename "$out")")
done
