#!/bin/bash
# demo.sh: the `make demo` scene, run inside the guest by cluster.sh (so the
# API server is up and E2E_KUBECONFIG is set). Applies the example
# Services, starts a pod per endpoint, runs ipvsproxy, then shows the
# kernel it programmed and real traffic through the VIPs.
set -euo pipefail
: "${E2E_CTL:?}" "${E2E_IPVSPROXY:?}" "${E2E_KUBECONFIG:?}" "${E2E_RESULTS:?}" "${E2E_EXAMPLES:?}"
show() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }

echo "== applying $(ls "$E2E_EXAMPLES"/*.yaml | xargs -n1 basename | tr '\n' ' ')(a pod per endpoint)"
"$E2E_CTL" apply --kubeconfig "$E2E_KUBECONFIG" --pods "$E2E_RESULTS" "$E2E_EXAMPLES"/*.yaml

echo "== starting ipvsproxy (log: $E2E_RESULTS/ipvsproxy.log)"
"$E2E_IPVSPROXY" --kubeconfig "$E2E_KUBECONFIG" --hostname-override "$E2E_NODE" \
  --cluster-cidr 10.244.0.0/16 --ipvs-sync-period 10s --ipvs-min-sync-period 0s \
  --iptables-backend "$E2E_IPTABLES" --healthz-bind-address 127.0.0.1:10256 \
  --metrics-bind-address 127.0.0.1:10249 -v 2 >"$E2E_RESULTS/ipvsproxy.log" 2>&1 &
proxy=$!
start=${EPOCHREALTIME/./}
# The example VIPs are fixed (10.96.0.80, 10.96.0.53): wait for both.
for _ in $(seq 1 100); do
  ipvsadm -Ln 2>/dev/null | grep -q '10.96.0.80:80' && ipvsadm -Ln | grep -q '10.96.0.53:53' && break
  kill -0 "$proxy" 2>/dev/null || { echo "ipvsproxy exited:"; tail -20 "$E2E_RESULTS/ipvsproxy.log"; exit 1; }
  sleep 0.1
done
echo "== kernel programmed $(( (${EPOCHREALTIME/./} - start) / 1000 )) ms after ipvsproxy started"

show ipvsadm -Ln
# `ipset list -t` prints ~30 sets (IPv4 and IPv6 twins, mostly empty at
# this point): one line each, then the two sets a ClusterIP service fills.
printf '\n\033[1m$ ipset list -t  (one line per set)\033[0m\n'
ipset list -t | awk '/^Name:/{n=$2} /^Type:/{t=$2} /^Number of entries:/{printf "%-32s %-18s %s entries\n", n, t, $4}'
show ipset list KUBE-CLUSTER-IP
show ipset list KUBE-LOOP-BACK
show ip addr show kube-ipvs0
for _ in 1 2 3; do show curl -s --max-time 3 http://10.96.0.80/; done
show "$E2E_CTL" ask udp 10.96.0.53 53 2
sleep 2 # the kernel folds per-CPU counters into the stats every 2 s
show ipvsadm -Ln --stats
kill "$proxy"
