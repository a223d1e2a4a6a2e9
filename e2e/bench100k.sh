#!/usr/bin/env bash
# bench100k.sh: issue 9's benchmark — ipvsproxy programming 100,000
# Services × 10 endpoints into the sandbox's real kernel (docs/benchmarks.md,
# "100,000 services (issue 9)"). On the host: packages, bin/ipvsproxy
# (make build), the host tests of the fake API server, the benchmark binary;
# then boot the sandbox and run e2e/cmd/bench100k there as root. No etcd
# and no kube-apiserver: the objects come from a client-go fake clientset
# served to the unmodified proxy process (see e2e/cmd/bench100k).
#
# Environment:
#   BENCH100K_N=100000        services (10 endpoints each); 2000 is the smoke run
#   BENCH100K_MEM=SIZE        guest memory (default: 1.5 GB + 80 kB per service, in whole GB: 10G at 100,000)
#   BENCH100K_TIMEOUT=SECONDS kill the sandbox after this long (default: 1800 + 0.15 s per service)
#   BENCH100K_ARGS="..."      more flags for the benchmark (e.g. --full-passes 1)
#   E2E_RAISE_MAP_COUNT=1     past 5,000 services, raise the host's vm.max_map_count
#                             to one per 4 KiB of guest memory for the run (root; restored after;
#                             BENCH100K_RAISE_MAP_COUNT=1 is the old name)
#   E2E_IPVSPROXY=PATH        ipvsproxy binary (default: bin/ipvsproxy, built now)
#   E2E_PROFILE=1             sample the guest from the host with perf (e2e/sandbox/uml-profile):
#                             profile.txt names the guest kernel's and the programs' functions
# The cluster also holds default/kubernetes and kube-system/kube-dns, listed
# after the generated services; summary.md's "Start-up" table times them
# (issue 20). Without E2E_IPVSPROXY, bin/ipvsproxy is built from the
# checkout first (`make build`: a relink when nothing changed), so a run
# never measures an older binary by mistake (summary.md names the commit
# it measured).
# Results: e2e/out/bench100k-DATE/ (summary.md, bench100k.json, ipvsproxy.log,
# ipset-list-t-*.txt, metrics-*.txt, output.log), also e2e/out/bench100k-latest.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
total_start=$(date +%s)
trap 'restore_map_count; print_timings' EXIT

n=${BENCH100K_N:-100000}
# Measured at 20,000 (docs/benchmarks.md): the proxy's peak ~35 kB per
# service, the guest kernel ~7 kB (10 real servers, a virtual server, an
# address, set entries), the generator and fake API server ~10 kB; 80 kB
# per service leaves room for the page cache and transient copies.
mem=${BENCH100K_MEM:-$(( (1536 + n * 80 / 1000 + 1023) / 1024 ))G}
timeout=${BENCH100K_TIMEOUT:-$(( 1800 + n * 15 / 100 ))}

# Past 5,000 services (the largest size run before without it) the
# host must allow one mapping per page of guest memory (ensure_map_count
# in lib.sh says why).
if [ "$n" -gt 5000 ]; then
  ensure_map_count bench100k "$mem" "${E2E_RAISE_MAP_COUNT:-${BENCH100K_RAISE_MAP_COUNT:-0}}"
fi

stage "packages"; install_packages; stage_done
stage "binaries"
ipvsproxy=${E2E_IPVSPROXY:-}
if [ -z "$ipvsproxy" ]; then
  (cd "$repo" && make build)
  ipvsproxy=$repo/bin/ipvsproxy
fi
# The fake API server's own tests (host, seconds): informers get every
# object by watch-list and by paged list; a broken server would otherwise
# surface as a proxy that never finishes, hours into the sandbox.
go_build_e2e test -tags e2e -count=1 ./e2e/cmd/bench100k
guest_build "$repo/bin/e2e-bench100k" build -tags e2e ./e2e/cmd/bench100k
stage_done

export E2E_RESULTS; E2E_RESULTS=$(new_results bench100k)
# The host's load, every minute: the guest's one CPU is a host thread, so
# other work on the host stretches every wall time measured inside.
( while :; do echo "$(date +%T) $(cat /proc/loadavg)"; sleep 60; done ) > "$E2E_RESULTS/host-load.txt" &
load_pid=$!
stage "sandbox (N = $n, --mem $mem)"
uml_runner "$ipvsproxy" "$repo/bin/e2e-bench100k"
set +e
# shellcheck disable=SC2086 # BENCH100K_ARGS is a list of flags
(cd "$repo" && UML_OUT=$E2E_RESULTS UML_FOLLOW=1 "${runner[@]}" --timeout "$timeout" --mem "$mem" -- \
  "$repo/bin/e2e-bench100k" --n "$n" --ipvsproxy "$ipvsproxy" --results "$E2E_RESULTS" ${BENCH100K_ARGS:-})
rc=$?
set -e
kill "$load_pid" 2>/dev/null || true
stage_done
timings+=$(printf '  %-28s %4ds' total $(( $(date +%s) - total_start )))$'\n'
echo "bench100k: results in $E2E_RESULTS" >&2
[ "$rc" = 0 ] && echo "bench100k: done" >&2 || echo "bench100k: FAIL (status $rc)" >&2
exit "$rc"
