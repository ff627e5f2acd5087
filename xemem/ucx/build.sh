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

# 1. Debian source package. apt needs a deb-src entry for the configured suite; add one that
#    mirrors the existing deb entry when there is none.
if [ ! -e "$cache/source.stamp" ]; then
    if ! apt-cache showsrc ucx >/dev/null 2>&1 || [ -z "$(apt-cache showsrc ucx 2>/dev/null)" ]; then
        suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
        # The same archive the machine's binary packages come from.
        mirror=$(grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -1)
        [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
        [ -n "$mirror" ] || { log "no Debian archive configured in apt's sources"; exit 1; }
        log "adding a deb-src entry for $suite"
        cat >/etc/apt/sources.list.d/clowder-deb-src.sources <<SRC
Types: deb-src
URIs: $mirror
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
        apt-get update -qq
    fi
    rm -rf "$cache/apt" && mkdir -p "$cache/apt"
    # apt-get source unpacks with dpkg-source, which applies Debian's patches: the result is
    # UCX exactly as Debian ships it.
    (cd "$cache/apt" && apt-get source -qq ucx)
    unpacked=$(find "$cache/apt" -mindepth 1 -maxdepth 1 -type d -name 'ucx-*' | head -1)
    [ -n "$unpacked" ] || { log "apt-get source ucx unpacked nothing"; exit 1; }
    rm -rf "$src_dir" && mv "$unpacked" "$src_dir"
    touch "$cache/source.stamp"
fi

# 2. Build tools. Release tarballs ship a generated configure; only regenerate it (which needs
#    autoconf/automake/libtool) when it is missing.
if [ ! -x "$src_dir/configure" ]; then
    if ! command -v autoreconf >/dev/null || ! command -v libtoolize >/dev/null; then
        log "installing autoconf, automake, libtool"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq autoconf automake libtool >/dev/null
    fi
    (cd "$src_dir" && ./autogen.sh) >"$cache/autogen.log" 2>&1 || { tail -20 "$cache/autogen.log"; exit 1; }
fi

# 3. Configure. UCX finds XPMEM as it finds Cray's: by pkg-config (cray-xpmem.pc, which
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

# 4. Build and install.
make -C "$obj_dir" -j"$jobs" >"$cache/make.log" 2>&1 || { tail -40 "$cache/make.log"; exit 1; }
make -C "$obj_dir" install >"$cache/install.log" 2>&1 || { tail -40 "$cache/install.log"; exit 1; }
[ -e "$install_dir/lib/ucx/libuct_xpmem.so" ] || { log "libuct_xpmem.so was not built"; exit 1; }
log "built into $install_dir"
