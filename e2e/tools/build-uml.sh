#!/usr/bin/env bash
# build-uml.sh: build (once) the sandbox's user-mode-Linux kernel from
# Debian's linux-source package with e2e/sandbox/uml.config, and print two
# lines: the kernel binary and its module tree (MODROOT, laid out as
# MODROOT/lib/modules/KVER for `modprobe -d`).
#
# Why our own build: Debian's user-mode-linux package (6.1) has no
# nf_tables for ip/ip6/inet, and neither it nor an unpatched 6.12 boots on
# hosts whose CPUs have a large XSAVE area (AMX: 11008 bytes): init dies at
# once with "ptrace set fp regs failed, errno = 14", because the host's
# PTRACE_SETREGSET takes exactly its own XSAVE size and UML passes a fixed
# 2696. e2e/sandbox/uml-xstate.patch makes UML pass the host's size.
#
# Cached outside the checkout ($E2E_CACHE, default ~/.cache/ipvsproxy-e2e)
# under the source version and the config's hash: a fresh clone on the same
# machine reuses it; a new config or source version builds anew (9.4 min
# measured while another build shared the two cores).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
sandbox=$here/../sandbox
cache=${E2E_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/ipvsproxy-e2e}
# E2E_KERNEL picks the source: 6.12 (default: nf_tables with every family,
# both iptables backends) or 6.1 (uml-6.1.config: nf_tables without the
# ip/ip6/inet families, so only the legacy backend works, as on Debian's
# own user-mode-linux 6.1).
kernel=${E2E_KERNEL:-6.12}
case "$kernel" in
  6.12) fragments=("$sandbox/uml.config"); patchfile=$sandbox/uml-xstate.patch ;;
  6.1) fragments=("$sandbox/uml.config" "$sandbox/uml-6.1.config"); patchfile=$sandbox/uml-xstate-6.1.patch ;;
  *) echo "build-uml.sh: E2E_KERNEL=$kernel: want 6.12 or 6.1" >&2; exit 2 ;;
esac
# The patch is our one change to the source: without it no UML kernel
# (6.1 or 6.12) boots on a host with AMX, see the patch.
src_pkg=linux-source-$kernel
tarball=/usr/src/$src_pkg.tar.xz

if [ ! -f "$tarball" ]; then
  echo "build-uml.sh: installing $src_pkg and the kernel build tools" >&2
  [ "$(id -u)" = 0 ] || { echo "build-uml.sh: $tarball missing and not root to install $src_pkg" >&2; exit 1; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "$src_pkg" build-essential flex bison bc libelf-dev kmod xz-utils >&2
fi
src_version=$(dpkg-query -W -f '${Version}' "$src_pkg")
key=$(printf '%s\n' "$src_version" | cat - "${fragments[@]}" "$patchfile" | sha256sum | cut -c1-12)
out=$cache/uml/$key
if [ ! -x "$out/linux" ]; then
  echo "build-uml.sh: building user-mode Linux from $src_pkg $src_version (cached at $out; ~10 min on two free cores)" >&2
  start=$(date +%s)
  work=$cache/uml/build-$key.$$
  rm -rf "$work"; mkdir -p "$work"
  tar -xf "$tarball" -C "$work"
  tree=$(echo "$work"/linux-source-*)
  (
    cd "$tree"
    patch -s -p1 < "$patchfile"
    make -s ARCH=um defconfig
    scripts/kconfig/merge_config.sh -m -O . .config "${fragments[@]}" >/dev/null
    make -s ARCH=um olddefconfig
    # Every option of the fragments (the last one naming an option wins)
    # must have survived olddefconfig: one that a dependency dropped would
    # show only as a failing test later.
    while IFS='=' read -r k v; do
      got=$(grep -E "^$k=|^# $k is not set" .config || true)
      case "$v" in
        n) [ -z "$got" ] || [ "$got" = "# $k is not set" ] || { echo "build-uml.sh: $k: want n, got $got" >&2; exit 1; } ;;
        *) [ "$got" = "$k=$v" ] || { echo "build-uml.sh: $k: want $v, got ${got:-nothing}" >&2; exit 1; } ;;
      esac
    done < <(awk '/^CONFIG_[A-Z0-9_]*=/ { i = index($0, "="); v[substr($0, 1, i-1)] = substr($0, i+1); next }
                  /^# CONFIG_[A-Z0-9_]* is not set$/ { v[$2] = "n" }
                  END { for (k in v) print k "=" v[k] }' "${fragments[@]}")
    make -s ARCH=um -j"$(nproc)" linux modules
    kver=$(make -s ARCH=um kernelrelease)
    make -s ARCH=um modules_install INSTALL_MOD_PATH="$work/modroot" >/dev/null
    depmod -b "$work/modroot" "$kver"
    strip -o "$work/linux" linux
  ) >&2 # stdout carries only the two paths
  mkdir -p "$out"
  rm -rf "$out/modroot"
  mv "$work/modroot" "$out/modroot"
  mv -f "$work/linux" "$out/linux"   # last: its presence marks a complete build
  rm -rf "$work"
  echo "build-uml.sh: built in $(( $(date +%s) - start ))s" >&2
fi
echo "$out/linux"
echo "$out/modroot"
