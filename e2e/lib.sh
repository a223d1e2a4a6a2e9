# lib.sh: shared by run.sh and demo.sh (sourced, not run). Installs what the
# sandbox needs on a fresh Debian/Ubuntu machine and builds the guest's
# binaries. Every stage's duration is printed and collected in $timings.
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
e2e=$repo/e2e
timings=""
stage_start=0

stage() { stage_name=$1; stage_start=$(date +%s); echo "==> $stage_name" >&2; }
stage_done() {
  local d=$(( $(date +%s) - stage_start ))
  timings+=$(printf '  %-28s %4ds' "$stage_name" "$d")$'\n'
  echo "    ($stage_name: ${d}s)" >&2
}
print_timings() { printf 'stage timings:\n%s' "$timings" >&2; }

# Commands the sandbox uses, and the Debian package providing each; the
# kernel build's tools (tools/build-uml.sh) too.
declare -A pkg_of=(
  [depmod]=kmod [ipvsadm]=ipvsadm [ipset]=ipset
  [iptables-legacy]=iptables [ip]=iproute2 [curl]=curl
  [conntrack]=conntrack [nft]=nftables
  [make]=build-essential [flex]=flex [bison]=bison [bc]=bc [xz]=xz-utils
)

# uml_runner BINARY...: sets the array `runner` to the sandbox's runner:
# uml-run, or with E2E_PROFILE=1 uml-profile, which samples the guest
# from the host with perf and names the functions of the guest kernel and
# of each BINARY (profile.txt in the results; e2e/sandbox/uml-profile).
uml_runner() {
  runner=("$e2e/sandbox/uml-run")
  if [ "${E2E_PROFILE:-0}" = 1 ]; then
    runner=("$e2e/sandbox/uml-profile")
    for b in "$@"; do runner+=(--binary "$b"); done
  fi
}

install_packages() {
  local missing=()
  for c in "${!pkg_of[@]}"; do
    PATH=$PATH:/usr/sbin:/sbin command -v "$c" >/dev/null 2>&1 || missing+=("${pkg_of[$c]}")
  done
  local k
  for k in 6.12 6.1; do # the two sandbox kernels' sources (E2E_KERNEL)
    [ -f "/usr/src/linux-source-$k.tar.xz" ] || missing+=("linux-source-$k")
  done
  [ -f /usr/include/libelf.h ] || missing+=(libelf-dev)
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "    installing: ${missing[*]}" >&2
  if [ "$(id -u)" != 0 ]; then
    echo "e2e: missing packages (${missing[*]}) and not root to install them" >&2
    return 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

# go_build_e2e ARGS...: `go ARGS` with the e2e tag, static for the guest.
# The e2e code needs client-go's whole dependency closure in go.sum; if the
# root module's go.sum lacks some of it, fall back to a private workspace
# (e2e/.cache/work) whose go.work.sum holds the missing checksums, so the
# product's go.mod/go.sum are never rewritten by the harness.
go_build_e2e() {
  local log
  if log=$(cd "$repo" && CGO_ENABLED=0 go "$@" 2>&1); then return 0; fi
  if ! grep -q 'missing go.sum entry' <<<"$log"; then echo "$log" >&2; return 1; fi
  echo "    root go.sum lacks client-go checksums; using e2e/.cache/work/go.work" >&2
  mkdir -p "$e2e/.cache/work"
  local gover
  gover=$(awk '$1 == "go" {print $2; exit}' "$repo/go.mod")
  printf 'go %s\n\nuse ../../..\n' "$gover" > "$e2e/.cache/work/go.work"
  (cd "$repo" && export GOWORK=$e2e/.cache/work/go.work &&
    go mod download k8s.io/client-go k8s.io/api k8s.io/apimachinery &&
    CGO_ENABLED=0 go "$@")
}

# cluster_binaries: builds (cached) the guest cluster's kube-apiserver and
# etcd from e2e/tools and exports them as E2E_APISERVER and E2E_ETCD, the
# names guest/cluster.sh reads.
cluster_binaries() {
  local bins
  mapfile -t bins < <("$e2e/tools/build.sh" kube-apiserver etcd)
  export E2E_APISERVER=${bins[0]} E2E_ETCD=${bins[1]}
}

# guest_build OUT GO-ARGS... PACKAGE: go_build_e2e GO-ARGS -o OUT PACKAGE,
# through a temporary file renamed into place. A sandbox still running the
# previous OUT reads it page by page through hostfs; rewriting the file in
# place would change it under that run, a rename leaves it its own inode.
guest_build() {
  local out=$1; shift
  local pkg=${*: -1}
  go_build_e2e "${@:1:$#-1}" -o "$out.tmp.$$" "$pkg" && mv -f "$out.tmp.$$" "$out"
}

build_guest_binaries() {
  mkdir -p "$repo/bin"
  guest_build "$repo/bin/e2ectl" build -tags e2e ./e2e/cmd/e2ectl
  guest_build "$repo/bin/e2e.test" test -tags e2e -c ./e2e
}

# new_results NAME: a fresh results folder e2e/out/NAME-TIME, also linked
# as e2e/out/NAME-latest.
new_results() {
  local dir old
  # Keep the five newest runs of this kind; results are for looking at, not
  # for piling up on a CI runner's disk.
  mkdir -p "$e2e/out"
  for old in $(ls -1d "$e2e/out/$1"-2* 2>/dev/null | sort -r | tail -n +5); do rm -rf "$old"; done
  dir=$e2e/out/$1-$(date +%Y%m%d-%H%M%S)
  mkdir -p "$dir"
  ln -sfn "$(basename "$dir")" "$e2e/out/$1-latest"
  echo "$dir"
}

# User-mode Linux maps each guest process's memory into a host process
# page by page; pages that are not contiguous in the guest's RAM file
# need a host mapping (VMA) each. Once the guest's memory is fragmented
# (the kernel's IPVS objects interleave with the processes' heaps), a
# guest process of more than ~256 MB — the proxy, or kube-apiserver
# holding 6,000 Services — can hit the host's vm.max_map_count (65,530 by
# default) and the whole guest dies ("UML ran out of memory on the host
# side"): seen at 10,000 services in bench100k.sh, and in bench.sh on the
# 6.12 kernel while the API server held 6,200 Services.
#
# ensure_map_count WHO MEM RAISE: make sure the host allows one mapping
# per 4 KiB page of MEM (the guest's memory, as uml-run's --mem takes
# it). With RAISE=1 (root) it raises vm.max_map_count for this run;
# restore_map_count, in the script's EXIT trap, puts it back. Otherwise
# it stops the script saying what to do.
map_count_restore=
ensure_map_count() {
  local who=$1 mem=$2 raise=$3 mem_kb need have
  mem_kb=$(numfmt --from=iec "$mem" | awk '{print int($1 / 1024)}')
  need=$(( mem_kb / 4 ))
  have=$(cat /proc/sys/vm/max_map_count)
  [ "$have" -lt "$need" ] || return 0
  if [ "$raise" != 1 ]; then
    echo "$who: the host's vm.max_map_count is $have; a guest of $mem needs $need (see ensure_map_count in e2e/lib.sh)." >&2
    echo "  As root: E2E_RAISE_MAP_COUNT=1 (raised for this run, restored after), or sysctl -w vm.max_map_count=$need" >&2
    exit 2
  fi
  sysctl -qw vm.max_map_count="$need"
  map_count_restore=$have
  echo "    vm.max_map_count raised from $have to $need for this run" >&2
}
restore_map_count() {
  [ -n "$map_count_restore" ] || return 0
  sysctl -qw vm.max_map_count="$map_count_restore" && echo "    vm.max_map_count restored to $map_count_restore" >&2
}

# bench_proxies KERNEL LARGEST [LIST]: bench.sh's proxies (BENCH_PROXIES:
# LIST, space or comma separated; empty: the default for the kernel and
# the largest size), printed on one line. The default is every proxy,
# without kube-proxy's IPVS mode past 5,000 services (its first sync
# alone takes about an hour at 10,000, past BENCH_PROGRAM_TIMEOUT's 30
# minutes). On 6.1 (no inet nf_tables) the nftables variants are left
# out, with one line saying so. An unknown name stops with status 2.
bench_proxies() {
  local kernel=$1 largest=$2 list=${3:-} p out=() dropped=()
  if [ -z "$list" ]; then
    list="ipvsproxy ipvsproxy-nftables kube-proxy-nftables kube-proxy"
    if [ "$largest" -gt 5000 ]; then
      list=${list% kube-proxy}
      echo "bench: kube-proxy (IPVS mode) is not in the default past 5,000 services (its first sync takes about an hour at 10k); name it in BENCH_PROXIES to measure it" >&2
    fi
  fi
  for p in ${list//,/ }; do
    case "$p" in
      ipvsproxy | kube-proxy) out+=("$p") ;;
      ipvsproxy-nftables | kube-proxy-nftables)
        if [ "$kernel" = 6.1 ]; then dropped+=("$p"); else out+=("$p"); fi ;;
      *) echo "bench: BENCH_PROXIES: unknown proxy $p (ipvsproxy, ipvsproxy-nftables, kube-proxy, kube-proxy-nftables)" >&2; return 2 ;;
    esac
  done
  [ ${#dropped[@]} -eq 0 ] || echo "bench: left out on the 6.1 kernel (no inet nf_tables): ${dropped[*]}" >&2
  if [ ${#out[@]} -eq 0 ]; then
    echo "bench: no proxy to measure" >&2
    return 2
  fi
  echo "${out[*]}"
}

# bench_proxy_flags PROXIES IPVSPROXY KUBE_PROXY: e2e/cmd/bench's flags
# choosing PROXIES (bench_proxies' line), one argument per line: each
# binary's variants, in PROXIES' order, as its mode flag's values.
# ipvsproxy's variants run first (the table's ratios are against the first).
bench_proxy_flags() {
  local backends= modes= p
  for p in $1; do
    case "$p" in
      ipvsproxy) backends+=" iptables" ;;
      ipvsproxy-nftables) backends+=" nftables" ;;
      kube-proxy) modes+=" ipvs" ;;
      kube-proxy-nftables) modes+=" nftables" ;;
    esac
  done
  [ -z "$backends" ] || printf '%s\n' --ipvsproxy "$2" --ipvsproxy-backends "${backends# }"
  [ -z "$modes" ] || printf '%s\n' --kube-proxy "$3" --kube-proxy-modes "${modes# }"
}
