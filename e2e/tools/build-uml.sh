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
cache=${E2E_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/ipvsproxy-e2e}
config=$here/../sandbox/uml.config
# Our one change to the source: without it no UML kernel (6.1 or 6.12)
# boots on a host with AMX, see the patch.
patchfile=$here/../sandbox/uml-xstate.patch
src_pkg=linux-source-6.12
tarball=/usr/src/$src_pkg.tar.xz

if [ ! -f "$tarball" ]; then
  echo "build-uml.sh: installing $src_pkg and the kernel build tools" >&2
  [ "$(id -u)" = 0 ] || { echo "build-uml.sh: $tarball missing and not root to install $src_pkg" >&2; exit 1; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "$src_pkg" build-essential flex bison bc libelf-dev kmod xz-utils >&2
fi
src_version=$(dpkg-query -W -f '${Version}' "$src_pkg")
key=$(printf '%s\n' "$src_version" | cat - "$config" "$patchfile" | sha256sum | cut -c1-12)
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
    scripts/kconfig/merge_config.sh -m -O . .config "$config" >/dev/null
    make -s ARCH=um olddefconfig
    # Every option of the fragment must have survived olddefconfig: one
    # that a dependency dropped would show only as a failing test later.
    while IFS='=' read -r k v; do
      case "$k" in CONFIG_*) ;; *) continue ;; esac
      got=$(grep -E "^$k=|^# $k is not set" .config || true)
      case "$v" in
        n) [ -z "$got" ] || [ "$got" = "# $k is not set" ] || { echo "build-uml.sh: $k: want n, got $got" >&2; exit 1; } ;;
        *) [ "$got" = "$k=$v" ] || { echo "build-uml.sh: $k: want $v, got ${got:-nothing}" >&2; exit 1; } ;;
      esac
    done < "$config"
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
