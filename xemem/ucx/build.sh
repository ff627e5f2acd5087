#!/usr/bin/env bash
# Builds UCX from Debian's source package against clowder's xpmem.h and libxpmem, so that
# UCX's xpmem transport (uct_xpmem) can be tested unmodified against our library.
#
# Idempotent: every step leaves a stamp or an artefact under build/ucx/ and is skipped when it
# is there. Only host transports are configured (UCT's sm family: posix, sysv, cma, xpmem;
# self, tcp) with ucs, ucm, ucp and the tools (ucx_perftest, ucx_info); no verbs, rdmacm,
# CUDA, ROCm, Java, Go or docs. 2.5-6 minutes on two shared cores, then a no-op.
# Needs root (a deb-src entry and, when missing, autoconf/automake/libtool from apt).
#
# Output: build/ucx/install/{bin/ucx_perftest,bin/ucx_info,lib/...}
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
cache="${UCX_BUILD_DIR:-$repo/build/ucx}"   # another directory: a clean build beside the cache
src_dir="$cache/source"      # the unpacked Debian source package
obj_dir="$cache/obj"         # out-of-tree configure/build directory
install_dir="$cache/install"
xpmem_prefix="${XPMEM_PREFIX:-$repo/xemem/build}"   # lib/pkgconfig/cray-xpmem.pc (and what it names): make -C xemem, or an installed tree
jobs=${UCX_BUILD_JOBS:-2}

log() { echo "ucx build: $*" >&2; }

if [ -x "$install_dir/bin/ucx_perftest" ] && [ -e "$install_dir/lib/ucx/libuct_xpmem.so" ]; then
    # Still rebuild our library (cheap) so a changed libxpmem is picked up: UCX links to it
    # dynamically, so UCX itself need not be rebuilt.
    make -s -C "$repo/xemem" >/dev/null
    log "cached in $install_dir"
    exit 0
fi

mkdir -p "$cache"
make -s -C "$repo/xemem" >/dev/null

# 1. Debian source package (with a generated configure).
# shellcheck source=xemem/ucx/source.sh
. "$repo/xemem/ucx/source.sh"
ucx_source "$cache"

# 2. Configure. UCX finds XPMEM as it finds Cray's: by pkg-config (cray-xpmem.pc, which
#    make -C xemem writes into build/lib/pkgconfig), with no --with-xpmem and no cached
#    configure answers: our library exports the whole upstream ABI, xpmem_init included.
if [ ! -e "$obj_dir/config.status" ]; then
    mkdir -p "$obj_dir"
    (cd "$obj_dir" && PKG_CONFIG_PATH="$xpmem_prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}" \
        "$src_dir/configure" \
        --prefix="$install_dir" \
        --disable-doxygen-doc --disable-logging --disable-debug --disable-assertions \
        --disable-params-check --enable-optimizations \
        --without-verbs --without-rdmacm --without-cuda --without-rocm --without-knem \
        --without-java --without-go --without-ugni --without-gdrcopy --without-fuse3 \
        --without-mad --without-bfd \
        >"$cache/configure.log" 2>&1) || { tail -30 "$cache/configure.log"; exit 1; }
fi
grep -q 'UCT modules:.*xpmem' "$cache/configure.log" \
    || { log "configure did not enable the xpmem transport; see $cache/configure.log"; exit 1; }

# 3. Build and install.
make -C "$obj_dir" -j"$jobs" >"$cache/make.log" 2>&1 || { tail -40 "$cache/make.log"; exit 1; }
make -C "$obj_dir" install >"$cache/install.log" 2>&1 || { tail -40 "$cache/install.log"; exit 1; }
[ -e "$install_dir/lib/ucx/libuct_xpmem.so" ] || { log "libuct_xpmem.so was not built"; exit 1; }
log "built into $install_dir"
