#!/bin/sh
# ipvsproxy-node-prep: the DaemonSet's privileged init container.
#
# A non-privileged container sees /proc/sys read-only and may not load
# modules, so this sets up, once per pod start, what ipvsproxy needs and
# would otherwise fail on: the kernel modules here, then `ipvsproxy
# prepare-node` with the proxy's arguments for the sysctls and conntrack
# settings. ipvsproxy then finds them set and writes nothing.
set -eu

log() { echo "ipvsproxy-node-prep: $*" >&2; }

# A module may be built in, or a scheduler absent; ipvsproxy's own start-up
# checks report what is really missing, so a failure here is only logged.
for m in ip_vs ip_vs_rr ip_vs_wrr ip_vs_lc ip_vs_wlc ip_vs_lblc ip_vs_lblcr \
	ip_vs_dh ip_vs_sh ip_vs_sed ip_vs_nq ip_vs_mh nf_conntrack dummy \
	ip_set ip_set_hash_ip ip_set_hash_ipport ip_set_hash_ipportip \
	ip_set_hash_ipportnet ip_set_bitmap_port xt_set xt_mark xt_comment \
	xt_addrtype xt_conntrack; do
	modprobe "$m" 2>/dev/null || log "module $m not loaded (built in or missing)"
done

# The sysctls and conntrack settings: the proxy's own code, with the
# proxy's own arguments, so the two can never disagree.
exec /usr/local/bin/ipvsproxy prepare-node "$@"
