#!/usr/bin/env bash
# bench.sh: the kernel benchmark of ipvsproxy (--rules-backend=iptables
# and =nftables) against kube-proxy v1.37.2 --proxy-mode=ipvs and
# --proxy-mode=nftables in the user-mode-Linux sandbox (docs/benchmarks.md,
# "Kernel benchmark vs kube-proxy"). On the host: install missing
# packages, build kube-apiserver and (when measured) kube-proxy (cached),
# bin/ipvsproxy if missing, e2ectl and the benchmark; then boot the
# sandbox, start etcd + kube-apiserver inside (guest/cluster.sh) and run
# e2e/cmd/bench there.
#
# Environment:
#   BENCH_N="1000 5000 10000"  service counts, ascending, in one sandbox (default 1000)
#   BENCH_CHANGES=100          single-endpoint changes per proxy and size
#   BENCH_INTERVAL=500ms       write a change every interval (open loop); 0s: serial
#   BENCH_WORKERS=16           parallel API clients creating the services
#   BENCH_PROXIES="ipvsproxy ipvsproxy-nftables kube-proxy-nftables kube-proxy"
#                              which proxies to measure (the default; kube-proxy, its IPVS
#                              mode, only up to 5,000 services): ipvsproxy (iptables rules
#                              backend), ipvsproxy-nftables (--rules-backend=nftables),
#                              kube-proxy (--proxy-mode=ipvs), kube-proxy-nftables. ipvsproxy's
#                              run first, each binary's in this order; ratios are against
#                              the first, and kube-proxy-nftables ÷ ipvsproxy-nftables
#   BENCH_SERVICE_CHANGES=5    services added, then deleted, per proxy and size
#   E2E_KERNEL=6.12            sandbox kernel (6.1 has no inet/ip nf_tables: the two
#                              nftables variants are left out there, with a note)
#   BENCH_PROGRAM_TIMEOUT=30m  give up on a proxy whose initial programming takes longer
#   BENCH_TIMEOUT=SECONDS      kill the sandbox after this long (default: 900 + 1200 per 1k services)
#   BENCH_MEM=4G               guest memory
#   E2E_RAISE_MAP_COUNT=1      past 5,000 services, raise the host's vm.max_map_count for
#                              the run (root; restored after; see ensure_map_count in lib.sh)
#   E2E_IPVSPROXY=PATH         ipvsproxy binary (default bin/ipvsproxy)
#   E2E_PROFILE=1              sample the guest from the host with perf (e2e/sandbox/uml-profile):
#                              profile.txt names the guest kernel's and the programs' functions
# Results: e2e/out/bench-DATE/ (bench-table.md, bench-N-PROXY.json, each
# proxy's log, the API server's), also linked as e2e/out/bench-latest.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
total_start=$(date +%s)
trap 'restore_map_count; print_timings' EXIT

sizes=${BENCH_N:-1000}
largest=$(tr ' ,' '\n\n' <<<"$sizes" | sort -n | tail -1)
proxies=$(bench_proxies "${E2E_KERNEL:-6.12}" "$largest" "${BENCH_PROXIES:-}") || exit 2
echo "bench: proxies: $proxies" >&2
timeout=${BENCH_TIMEOUT:-$(( 900 + 1200 * (largest + 999) / 1000 ))}
mem=${BENCH_MEM:-4G}
if [ "$largest" -gt 5000 ]; then
  ensure_map_count bench "$mem" "${E2E_RAISE_MAP_COUNT:-0}"
fi

stage "packages"; install_packages; stage_done
stage "kube-apiserver, etcd, kube-proxy if measured (cached)"
cluster_binaries
kube_proxy=
case " $proxies " in
  *" kube-proxy "* | *" kube-proxy-nftables "*) kube_proxy=$("$e2e/tools/build.sh" kube-proxy) ;;
esac
stage_done
stage "binaries"
ipvsproxy=${E2E_IPVSPROXY:-$repo/bin/ipvsproxy}
if [ ! -x "$ipvsproxy" ]; then
  (cd "$repo" && CGO_ENABLED=0 go build -o "$ipvsproxy" ./cmd/ipvsproxy)
fi
mkdir -p "$repo/bin"
guest_build "$repo/bin/e2ectl" build -tags e2e ./e2e/cmd/e2ectl
guest_build "$repo/bin/e2e-bench" build -tags e2e ./e2e/cmd/bench
stage_done

args=(--n "$sizes" --changes "${BENCH_CHANGES:-100}" --interval "${BENCH_INTERVAL:-500ms}" --workers "${BENCH_WORKERS:-16}"
  --program-timeout "${BENCH_PROGRAM_TIMEOUT:-30m}" --service-changes "${BENCH_SERVICE_CHANGES:-5}")
mapfile -t proxy_args < <(bench_proxy_flags "$proxies" "$ipvsproxy" "$kube_proxy")
args+=("${proxy_args[@]}")
export E2E_CTL=$repo/bin/e2ectl
export E2E_RESULTS; E2E_RESULTS=$(new_results bench)

stage "sandbox: boot + apiserver + benchmark (N = $sizes)"
uml_runner "$ipvsproxy" "$repo/bin/e2e-bench"
set +e
(cd "$repo" && UML_OUT=$E2E_RESULTS UML_FOLLOW=1 "${runner[@]}" --timeout "$timeout" --mem "$mem" -- \
  "$e2e/guest/cluster.sh" "$repo/bin/e2e-bench" "${args[@]}")
rc=$?
set -e
stage_done
timings+=$(printf '  %-28s %4ds' total $(( $(date +%s) - total_start )))$'\n'
if [ -s "$E2E_RESULTS/bench-table.md" ]; then
  echo; cat "$E2E_RESULTS/bench-table.md"
fi
echo "bench: results in $E2E_RESULTS" >&2
[ "$rc" = 0 ] && echo "bench: done" >&2 || echo "bench: FAIL (status $rc)" >&2
exit "$rc"
