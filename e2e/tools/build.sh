#!/usr/bin/env bash
# build.sh: build Kubernetes commands from the pinned tools module into
# e2e/.cache/bin/NAME-VERSION, only when that file is missing (the first
# kube-apiserver build takes ~12 minutes on 2 cores, so it is cached).
#
#   e2e/tools/build.sh [kube-apiserver] [kube-proxy] ...
#
# Prints the path of each binary, one a line. CGO is off so the binaries
# are static and run inside the user-mode-Linux guest.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${E2E_CACHE:-$here/../.cache}
version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$here/go.mod")
[ -n "$version" ] || version=$(grep -o 'k8s.io/kubernetes v[0-9.]*' "$here/go.mod" | head -1 | cut -d' ' -f2)
[ $# -gt 0 ] || set -- kube-apiserver
mkdir -p "$cache/bin"
for name in "$@"; do
  case "$name" in
    kube-apiserver|kube-proxy) ;; # the commands tools.go pins in go.sum
    *) echo "build.sh: unknown command $name" >&2; exit 2 ;;
  esac
  out="$cache/bin/$name-$version"
  if [ ! -x "$out" ]; then
    echo "build.sh: building $name $version (cached at $out)" >&2
    start=$(date +%s)
    # Build to a temporary name first: an interrupted build must not leave
    # a half-written binary that a later run would take as cached.
    (cd "$here" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' \
      -o "$out.tmp" "k8s.io/kubernetes/cmd/$name")
    mv "$out.tmp" "$out"
    echo "build.sh: $name built in $(( $(date +%s) - start ))s" >&2
  fi
  (cd "$(dirname "$out")" && echo "$PWD/$(basename "$out")")
done
