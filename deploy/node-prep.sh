#!/bin/sh
# ipvsproxy-node-prep: the DaemonSet's privileged init container.
#
# A non-privileged container sees /proc/sys read-only and may not load
# modules, so this sets up, once per pod start, what ipvsproxy needs and
# would otherwise fail on: the kernel modules, and exactly the sysctls
# ipvsproxy writes at start (cmd/ipvsproxy/app/node.go, startupSysctls).
# ipvsproxy then finds them set and writes nothing.
#
# STRICT_ARP=true|false must match ipvs.strictARP in the config file.
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

set_sysctl() {
	if [ "$(cat "/proc/sys/$1")" != "$2" ]; then
		echo "$2" >"/proc/sys/$1"
		log "set $1=$2"
	fi
}

set_sysctl net/ipv4/vs/conntrack 1
set_sysctl net/ipv4/vs/expire_nodest_conn 1
set_sysctl net/ipv4/vs/expire_quiescent_template 1
set_sysctl net/ipv4/ip_forward 1

# Kernels before 5.9 stall new connections reusing a port of a
# terminating one unless conn_reuse_mode is 0 (kubernetes #81775).
release=$(uname -r)
major=${release%%.*}
minor=${release#*.}
minor=${minor%%[!0-9]*}
if [ "$major" -lt 5 ] || { [ "$major" -eq 5 ] && [ "$minor" -lt 9 ]; }; then
	set_sysctl net/ipv4/vs/conn_reuse_mode 0
fi

if [ "${STRICT_ARP:-false}" = "true" ]; then
	set_sysctl net/ipv4/conf/all/arp_ignore 1
	set_sysctl net/ipv4/conf/all/arp_announce 2
fi
