#!/usr/bin/env bash
# UCX's xpmem transport alone, built from Debian's UCX source against an XPMEM found by
# pkg-config (`cray-xpmem.pc`) under XPMEM_PREFIX, cheaply enough for make test: one configure
# with nothing optional, then only the libraries the transport needs (ucm, ucs, uct) and the
# xpmem module itself, not ucp, the other transports or the tools: about 3 minutes on two
# shared cores, against 3-6 for the whole of UCX (build.sh). A build is cached under
# build/ucx-xpmem/VERSION (VERSION: the Debian source's), so a rerun builds nothing; another
# XPMEM_PREFIX or PKG_CONFIG_SYSROOT_DIR (a DESTDIR) configures afresh. Needs root the first
# time on a machine (deb-src, apt).
#
# Output: build/ucx-xpmem/VERSION/stage/{lib/libucs.so.0,libuct.so.0,libucm.so.0,
# lib/ucx/libuct_xpmem.so.0,bin/list_transports} (UCX loads modules from ucx/ beside libucs),
# and the stage's path on stdout.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
xpmem_prefix=${XPMEM_PREFIX:?XPMEM_PREFIX names the tree whose lib/pkgconfig has cray-xpmem.pc}
jobs=${UCX_BUILD_JOBS:-2}
log() { echo "ucx xpmem build: $*" >&2; }

# shellcheck source=xemem/ucx/source.sh
. "$repo/xemem/ucx/source.sh"
version=$(ucx_source_version)
[ -n "$version" ] || { log "apt knows no ucx source package"; exit 1; }
cache=$repo/build/ucx-xpmem/$version
obj=$cache/obj
stage=$cache/stage
mkdir -p "$cache"
ucx_source "$cache"

# Configure again when it was configured for another XPMEM.
xpmem_key="${PKG_CONFIG_SYSROOT_DIR:-}:$xpmem_prefix"
if [ "$(cat "$cache/xpmem-prefix" 2>/dev/null)" != "$xpmem_key" ]; then
    rm -rf "$obj" "$stage"
fi
if [ ! -e "$obj/config.status" ]; then
    mkdir -p "$obj"
    (cd "$obj" && PKG_CONFIG_PATH="$xpmem_prefix/lib/pkgconfig" "$cache/source/configure" \
        --disable-doxygen-doc --disable-logging --disable-debug --disable-assertions --disable-params-check \
        --disable-numa --disable-openmp --disable-dependency-tracking \
        --without-verbs --without-rdmacm --without-cuda --without-rocm --without-knem --without-java --without-go \
        --without-ugni --without-gdrcopy --without-fuse3 --without-bfd --without-valgrind --without-cma \
        >"$cache/configure.log" 2>&1) || { tail -30 "$cache/configure.log" >&2; exit 1; }
    echo "$xpmem_key" >"$cache/xpmem-prefix"
fi
grep -q 'UCT modules:.*xpmem' "$cache/configure.log" || { log "configure did not enable the xpmem transport; see $cache/configure.log"; exit 1; }

# ucm and ucs whole (ucs's subdirectories are small), uct's library without its transport
# directories, then the one module.
: >"$cache/make.log"
for step in "src/ucm" "src/ucs" "src/uct libuct.la" "src/uct/sm/mm/xpmem"; do
    read -r dir target <<<"$step"
    # shellcheck disable=SC2086 # an optional target
    make -C "$obj/$dir" -j"$jobs" $target >>"$cache/make.log" 2>&1 || { tail -40 "$cache/make.log" >&2; exit 1; }
done

mkdir -p "$stage/lib/ucx" "$stage/bin"
cp -a "$obj"/src/ucm/.libs/libucm.so* "$obj"/src/ucs/.libs/libucs.so* "$obj"/src/uct/.libs/libuct.so* "$stage/lib/"
cp -a "$obj"/src/uct/sm/mm/xpmem/.libs/libuct_xpmem.so* "$stage/lib/ucx/"
cc -O2 -o "$stage/bin/list_transports" "$repo/xemem/ucx/list_transports.c" \
    -I"$cache/source/src" -I"$obj/src" -L"$stage/lib" -luct -lucs -Wl,-rpath,'$ORIGIN/../lib'
echo "$stage"
