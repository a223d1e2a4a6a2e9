#!/usr/bin/env bash
# bench.sh: the kernel benchmark of ipvsproxy against kube-proxy v1.37.2
# --proxy-mode=ipvs and --proxy-mode=nftables in the user-mode-Linux
# sandbox (docs/benchmarks.md, "Kernel benchmark vs kube-proxy"). On the host: install missing
# packages, build kube-apiserver and kube-proxy (cached), bin/ipvsproxy if
# missing, e2ectl and the benchmark; then boot the sandbox, start etcd +
# kube-apiserver inside (guest/cluster.sh) and run e2e/cmd/bench there.
#
# Environment:
#   BENCH_N="1000 5000 10000"  service counts, ascending, in one sandbox (default 1000)
#   BENCH_CHANGES=100          single-endpoint changes per proxy and size
#   BENCH_INTERVAL=500ms       write a change every interval (open loop); 0s: serial
#   BENCH_WORKERS=16           parallel API clients creating the services
#   BENCH_PROXIES="ipvsproxy kube-proxy kube-proxy-nftables"   which proxies to measure, in this order
#   BENCH_SERVICE_CHANGES=5    services added, then deleted, per proxy and size
#   E2E_KERNEL=6.12            sandbox kernel (6.1 has no nf_tables for ip: no kube-proxy-nftables)
#   BENCH_PROGRAM_TIMEOUT=30m  give up on a proxy whose initial programming takes longer
#   BENCH_TIMEOUT=SECONDS      kill the sandbox after this long (default: 900 + 1200 per 1k services)
#   BENCH_MEM=4G               guest memory
#   E2E_RAISE_MAP_COUNT=1      past 5,000 services, raise the host's vm.max_map_count for
#                              the run (root; restored after; see ensure_map_count in lib.sh)
#   E2E_IPVSPROXY=PATH         ipvsproxy binary (default bin/ipvsproxy)
# Results: e2e/out/bench-DATE/ (bench-table.md, bench-N-PROXY.json, each
# proxy's log, the API server's), also linked as e2e/out/bench-latest.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
total_start=$(date +%s)
trap 'restore_map_count; print_timings' EXIT

sizes=${BENCH_N:-1000}
default_proxies="ipvsproxy kube-proxy kube-proxy-nftables"
[ "${E2E_KERNEL:-6.12}" != 6.1 ] || default_proxies="ipvsproxy kube-proxy"
proxies=${BENCH_PROXIES:-$default_proxies}
largest=$(tr ' ,' '\n\n' <<<"$sizes" | sort -n | tail -1)
timeout=${BENCH_TIMEOUT:-$(( 900 + 1200 * (largest + 999) / 1000 ))}
mem=${BENCH_MEM:-4G}
if [ "$largest" -gt 5000 ]; then
  ensure_map_count bench "$mem" "${E2E_RAISE_MAP_COUNT:-0}"
fi

stage "packages"; install_packages; stage_done
stage "kube-apiserver, kube-proxy, etcd (cached)"
cluster_binaries
kube_proxy=$("$e2e/tools/build.sh" kube-proxy)
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
modes=
for p in $proxies; do
  case "$p" in
    ipvsproxy) args+=(--ipvsproxy "$ipvsproxy") ;;
    kube-proxy) modes+=" ipvs" ;;
    kube-proxy-nftables) modes+=" nftables" ;;
    *) echo "bench: BENCH_PROXIES: unknown proxy $p" >&2; exit 2 ;;
  esac
done
[ -z "$modes" ] || args+=(--kube-proxy "$kube_proxy" --kube-proxy-modes "${modes# }")
export E2E_CTL=$repo/bin/e2ectl
export E2E_RESULTS; E2E_RESULTS=$(new_results bench)

stage "sandbox: boot + apiserver + benchmark (N = $sizes)"
set +e
(cd "$repo" && UML_OUT=$E2E_RESULTS UML_FOLLOW=1 "$e2e/sandbox/uml-run" --timeout "$timeout" --mem "$mem" -- \
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
