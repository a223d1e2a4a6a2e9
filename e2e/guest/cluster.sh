#!/bin/bash
# cluster.sh: runs inside the user-mode-Linux guest (via uml-run) as root.
# Starts etcd and kube-apiserver on the guest's loopback, registers the
# sandbox Node, then runs "$@" with E2E_KUBECONFIG and E2E_NODE set and
# returns its status.
#
# Inputs (E2E_* variables pass through uml-run): E2E_APISERVER and E2E_ETCD
# (binaries, e2e/tools/build.sh), E2E_CTL (e2ectl binary), E2E_RESULTS (writable results folder, on the host).
set -euo pipefail
: "${E2E_APISERVER:?}" "${E2E_ETCD:?}" "${E2E_CTL:?}" "${E2E_RESULTS:?}"
export E2E_NODE=${E2E_NODE:-sandbox-node}
node_ip=${E2E_NODE_IP:-10.10.0.1}
work=/tmp/e2e
mkdir -p "$work/pki" "$work/certs"
t0=${EPOCHREALTIME/./}
stamp() { local d=$(( (${EPOCHREALTIME/./} - t0) / 100000 )); printf '[guest %4d.%ds] %s\n' $((d / 10)) $((d % 10)) "$*"; }

# The node's own address, on a dummy link: the sandbox has no NIC, and
# ipvsproxy needs a node IP (the Node's InternalIP) for later NodePort tests.
ip link add node0 type dummy
ip addr add "$node_ip/24" dev node0
# A global IPv6 address too: without one the guest talks to IPv6 pods from
# the link-local fe80::1, and a pod's UDP reply then leaves from its own
# link-local address, which the client's connected socket ignores.
ip -6 addr add "${E2E_NODE_IP6:-fd00:10:10::1}/64" dev node0 nodad
ip link set node0 up
# IPv6 forwarding too, for dual-stack services (ip_forward is set by uml-init).
sysctl -qw net.ipv6.conf.all.forwarding=1
# Plain `iptables` (the tests' and an operator's) is the backend under
# test, E2E_IPTABLES (uml-run sets it from E2E_KERNEL), whatever Debian's
# alternatives say: shadow the names on PATH.
: "${E2E_IPTABLES:?set by uml-run}"
mkdir -p /run/e2e-bin
for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
  ln -sf "/usr/sbin/${t%%-*}-$E2E_IPTABLES${t#${t%%-*}}" "/run/e2e-bin/$t"
done
export PATH=/run/e2e-bin:$PATH

# Progress notifications every 5 s, as production control planes set them
# (Talos, kine's default; KEP-1904): the API server's watch cache of a
# kind nobody writes — the Node, here, with no kubelet — advances only
# through them. Without them, after an API server restart that cache stays
# at its start revision and every consistent list or informer relist of
# the kind fails with "Too large resource version" (TestAPIServerOutage).
"$E2E_ETCD" --name sandbox --data-dir "$work/etcd" \
  --watch-progress-notify-interval=5s \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster sandbox=http://127.0.0.1:2380 \
  >"$E2E_RESULTS/etcd.log" 2>&1 &

"$E2E_CTL" keys "$work/pki"
token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo "$token,admin,admin,system:masters" > "$work/tokens.csv"

# --allow-privileged=true as on kubeadm clusters: deploy/daemonset.yaml (a
# node proxy, privileged like kube-proxy's) is checked against this server.
"$E2E_APISERVER" \
  --etcd-servers=http://127.0.0.1:2379 \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port=6443 \
  --endpoint-reconciler-type=none \
  --service-cluster-ip-range="${E2E_SERVICE_CIDR:-10.96.0.0/16,fd00:10:96::/108}" \
  --authorization-mode=AlwaysAllow \
  --allow-privileged=true \
  --token-auth-file="$work/tokens.csv" \
  --service-account-issuer=https://kubernetes.default.svc \
  --service-account-key-file="$work/pki/sa.pub" \
  --service-account-signing-key-file="$work/pki/sa.key" \
  --cert-dir="$work/certs" \
  >"$E2E_RESULTS/kube-apiserver.log" 2>&1 &
apiserver_pid=$!

cat > "$work/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: sandbox
  cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: admin
  user: {token: "$token"}
contexts:
- name: sandbox
  context: {cluster: sandbox, user: admin}
current-context: sandbox
KC
export E2E_KUBECONFIG=$work/kubeconfig

for i in $(seq 1 240); do
  if curl -sfk -H "Authorization: Bearer $token" https://127.0.0.1:6443/readyz >/dev/null 2>&1; then
    break
  fi
  if ! kill -0 "$apiserver_pid" 2>/dev/null; then
    echo "cluster.sh: kube-apiserver exited; last lines of its log:" >&2
    tail -n 30 "$E2E_RESULTS/kube-apiserver.log" >&2
    exit 3
  fi
  [ "$i" = 240 ] && { echo "cluster.sh: kube-apiserver not ready after 120s" >&2; tail -n 30 "$E2E_RESULTS/kube-apiserver.log" >&2; exit 3; }
  sleep 0.5
done
stamp "etcd + kube-apiserver ready"
"$E2E_CTL" node --kubeconfig "$E2E_KUBECONFIG" --name "$E2E_NODE" --ip "$node_ip"
stamp "node $E2E_NODE ($node_ip) registered; running: $*"

set +e
"$@"
rc=$?
stamp "finished with status $rc"
exit $rc
