#!/bin/sh
# iptables, iptables-save, iptables-restore and the ip6tables ones, for an
# operator in the pod: runs the backend the node uses, legacy or nft, as
# kube-proxy's image does with its iptables-wrapper. ipvsproxy itself does
# not go through this: it calls iptables-legacy-* or iptables-nft-* by name
# (--iptables-backend, detected the same way when auto).
#
# The node's backend: the one whose mangle table holds kube's
# KUBE-IPTABLES-HINT chain, else the one with more rules.
set -u
save() { "iptables-$1-save" 2>/dev/null; "ip6tables-$1-save" 2>/dev/null; }
hint() { "iptables-$1-save" -t mangle 2>/dev/null | grep -q '^:KUBE-IPTABLES-HINT'; }
if hint nft; then
	mode=nft
elif hint legacy; then
	mode=legacy
else
	legacy=$(save legacy | grep -c '^-')
	nft=$(save nft | grep -c '^-')
	mode=nft
	[ "$legacy" -gt "$nft" ] && mode=legacy
fi
name=$(basename "$0")
case "$name" in
*-save | *-restore) exec "/usr/sbin/${name%-*}-$mode-${name##*-}" "$@" ;;
*) exec "/usr/sbin/$name-$mode" "$@" ;;
esac
