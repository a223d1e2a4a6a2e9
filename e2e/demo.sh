#!/usr/bin/env bash
# demo.sh (`make demo`): boot the sandbox, apply e2e/examples/*.yaml, run
# bin/ipvsproxy and show the kernel it programs, with real traffic.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
trap print_timings EXIT
stage "packages"; install_packages; stage_done
stage "kube-apiserver, etcd (cached)"; cluster_binaries; stage_done
stage "demo binaries"; guest_build "$repo/bin/e2ectl" build -tags e2e ./e2e/cmd/e2ectl; stage_done
export E2E_IPVSPROXY=${E2E_IPVSPROXY:-$repo/bin/ipvsproxy} \
  E2E_CTL=$repo/bin/e2ectl E2E_EXAMPLES=${E2E_EXAMPLES:-$e2e/examples}
[ -x "$E2E_IPVSPROXY" ] || { echo "demo: $E2E_IPVSPROXY missing (make build)" >&2; exit 1; }
export E2E_RESULTS; E2E_RESULTS=$(new_results demo)
stage "sandbox: boot + apiserver + demo"
(cd "$repo" && UML_OUT=$E2E_RESULTS UML_FOLLOW=1 "$e2e/sandbox/uml-run" --timeout 300 --mem 3G -- \
  "$e2e/guest/cluster.sh" "$e2e/guest/demo.sh")
stage_done
