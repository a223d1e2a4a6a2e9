#!/usr/bin/env bash
# run.sh: the end-to-end suite (`make e2e`). On the host: install missing
# packages, build kube-apiserver and etcd (cached), the pods' backend and the test
# binary; then boot user-mode Linux, start etcd + kube-apiserver inside and
# run the tests as root against bin/ipvsproxy. Exits with the tests' status.
#
# Environment:
#   E2E_RUN=REGEXP       run only matching tests (go test -run)
#   E2E_TIMEOUT=SECONDS  kill a hung sandbox after this long (default 2400)
#   E2E_IPVSPROXY=PATH   binary under test (default bin/ipvsproxy)
#   E2E_VERBOSE=0        less test output (default: -test.v)
#   E2E_KERNEL=6.12|6.1  sandbox kernel (default 6.12; e2e/tools/build-uml.sh)
#   E2E_IPTABLES=nft|legacy  iptables backend under test (default: nft on
#                        6.12, legacy on 6.1; e2e/sandbox/uml-run)
#   E2E_RULES_BACKEND=iptables|nftables  --rules-backend under test (default
#                        iptables); the tests that read the rules and sets
#                        read that backend's (e2e/framework/rulesbackend.go)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
case "${E2E_RULES_BACKEND:-iptables}/${E2E_KERNEL:-6.12}" in
  iptables/* | nftables/6.12) ;;
  nftables/*) echo "e2e: E2E_RULES_BACKEND=nftables needs E2E_KERNEL=6.12 (the 6.1 sandbox kernel has no inet nf_tables)" >&2; exit 2 ;;
  *) echo "e2e: E2E_RULES_BACKEND=$E2E_RULES_BACKEND: want iptables or nftables" >&2; exit 2 ;;
esac
total_start=$(date +%s)
trap print_timings EXIT

stage "packages"; install_packages; stage_done
[ -n "${UML_KERNEL_DIR:-}" ] || { stage "user-mode Linux ${E2E_KERNEL:-6.12} kernel (cached)"; "$e2e/tools/build-uml.sh" >/dev/null; stage_done; }
stage "kube-apiserver, etcd (cached)"; cluster_binaries; stage_done
stage "e2e binaries"; build_guest_binaries; stage_done

export E2E_IPVSPROXY=${E2E_IPVSPROXY:-$repo/bin/ipvsproxy}
[ -x "$E2E_IPVSPROXY" ] || echo "e2e: warning: $E2E_IPVSPROXY missing; the ipvsproxy tests will fail (make build)" >&2
export E2E_CTL=$repo/bin/e2ectl
export E2E_RESULTS; E2E_RESULTS=$(new_results e2e)
timeout=${E2E_TIMEOUT:-2400}
args=(-test.count=1 -test.timeout="$(( timeout - 120 ))s")
[ "${E2E_VERBOSE:-1}" = 0 ] || args+=(-test.v)
[ -z "${E2E_RUN:-}" ] || args+=(-test.run="$E2E_RUN")

stage "sandbox: boot + apiserver + tests"
set +e
(cd "$repo" && UML_OUT=$E2E_RESULTS UML_FOLLOW=1 "$e2e/sandbox/uml-run" --timeout "$timeout" --mem 3G -- \
  "$e2e/guest/cluster.sh" "$repo/bin/e2e.test" "${args[@]}")
rc=$?
set -e
stage_done
timings+=$(printf '  %-28s %4ds' total $(( $(date +%s) - total_start )))$'\n'
echo "e2e: results (logs of ipvsproxy, kube-apiserver, etcd, pods; console.log) in $E2E_RESULTS" >&2
[ "$rc" = 0 ] && echo "e2e: PASS" >&2 || echo "e2e: FAIL (status $rc)" >&2
exit "$rc"
