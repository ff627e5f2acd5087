#!/usr/bin/env bash
# Builds clowder's small Linux guest kernel from Debian's linux-source package and prints the
# path of its vmlinux (an ELF with a PVH entry note, which clowder-vmm boots directly).
#   scripts/linux-kernel.sh              # the kernel
#   scripts/linux-kernel.sh initramfs    # the initramfs: the enclave agent as /init (static),
#                                        # in target/linux-guest/agent-initramfs.cpio
#
# The build is cached OUTSIDE the tree, keyed by the hash of the config fragment, the patches,
# the source package's version and the recipe's number, so every clone (and CI run) on a machine reuses it:
#   ${CLOWDER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/clowder}/linux-<key>/vmlinux
# A cold build takes a few minutes on two cores (run under `nice`).
set -euo pipefail

say() { echo "linux-kernel: $*" >&2; }
here=$(cd "$(dirname "$0")/.." && pwd)
fragment=$here/kernels/linux-guest/config
# Patches over Debian's source: only what a PVM host needs (each patch's comment says why).
patches=("$here"/kernels/linux-guest/*.patch)
package=linux-source-6.1

case "$#:${1:-}" in
    0: | 1:initramfs) ;;
    *) echo "usage: scripts/linux-kernel.sh [initramfs]" >&2; exit 2 ;;
esac

if [ "${1:-}" = initramfs ]; then
    command -v cpio >/dev/null || {
        say "installing cpio"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends cpio >/dev/null
    }
    # Static, so the initramfs needs no libraries; its own target directory keeps the host
    # build's flags apart. musl, not glibc: glibc's memcpy, memset and string functions pick
    # AVX2/AVX-512 variants (ymm16-31, zmm) by CPUID, and on PVM the guest kernel, then booted
    # with `noxsave`, kept only x87 and SSE state per thread, so the agent's threads overwrote
    # each other's copies in flight (docs/linux-guest.md: the corrupt copies, `free(): invalid
    # pointer`). Since the VMM carries out the guest kernel's XSAVE/XRSTOR (1f113fc) it keeps
    # every vector register per thread; the agent still uses none (checked below), so it does
    # not depend on that (a guest kernel that keeps no AVX state, a VMM without that path).
    rustup target list --installed | grep -qx x86_64-unknown-linux-musl || {
        say "installing Rust's x86_64-unknown-linux-musl target"
        rustup target add x86_64-unknown-linux-musl >/dev/null
    }
    (cd "$here" && RUSTFLAGS="-C target-feature=+crt-static" cargo build --quiet --release \
        -p clowder-linux-agent --target x86_64-unknown-linux-musl)
    agent=$here/target/x86_64-unknown-linux-musl/release/clowder-linux-agent
    # No AVX register anywhere but the memchr crate's AVX2 search (fuser's, for names the guest
    # kernel sends; a read-only compare, not a copy): a glibc build had 4856 such instructions.
    avx=$(objdump -d --no-show-raw-insn "$agent" | awk '/^[0-9a-f]+ </ { fn = $2 } /%[yz]mm/ { print fn }' |
        { grep -v '_ZN6memchr4arch6x86_64.*avx2' || true; } | sort -u | head -5)
    [ -z "$avx" ] || { say "the agent uses AVX registers (lost between guest threads on PVM) in: $avx"; exit 1; }
    out=$here/target/linux-guest
    stage=$out/agent-initramfs
    rm -rf "$stage"
    mkdir -p "$stage/dev"
    cp "$agent" "$stage/init"
    strip "$stage/init"
    # The kernel opens /dev/console for init's stdio before anything is mounted.
    mknod -m 600 "$stage/dev/console" c 5 1
    (cd "$stage" && find . | LC_ALL=C sort | cpio --quiet -o -H newc --owner 0:0 >"$out/agent-initramfs.cpio.tmp")
    mv "$out/agent-initramfs.cpio.tmp" "$out/agent-initramfs.cpio"
    echo "$out/agent-initramfs.cpio"
    exit 0
fi

if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" ||
    ! command -v flex >/dev/null || ! command -v bison >/dev/null || [ ! -f /usr/include/libelf.h ]; then
    say "installing $package and the kernel's build tools"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "$package" flex bison bc libelf-dev >/dev/null 2>&1 || {
        apt-get update -q >/dev/null
        apt-get install -y -q --no-install-recommends "$package" flex bison bc libelf-dev >/dev/null
    }
fi
version=$(dpkg-query -W -f='${Version}' "$package")
# Bump when the build steps below change what they produce.
recipe=1
key=$( (cat "$fragment" "${patches[@]}"; echo "$version $recipe") | sha256sum | cut -c1-16)
cache=${CLOWDER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/clowder}/linux-$key
if [ -f "$cache/vmlinux" ]; then
    echo "$cache/vmlinux"
    exit 0
fi

mkdir -p "$cache"
work=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
say "building Linux $version with $fragment in $work"
tar -xaf "/usr/src/$package.tar.xz" -C "$work"
src=$work/$package
for p in "${patches[@]}"; do
    patch -s -p1 -d "$src" <"$p" >&2
done
# Kconfig's chatter goes to a log, shown only if configuring fails. merge_config.sh makes its
# temporary files in the working directory: in $work, so that an interrupted build leaves none
# in the caller's.
if ! { make -C "$src" -s tinyconfig &&
    (cd "$work" && "$src/scripts/kconfig/merge_config.sh" -m -O "$src" "$src/.config" "$fragment") &&
    make -C "$src" -s olddefconfig; } >"$work/config.log" 2>&1; then
    cat "$work/config.log" >&2
    exit 1
fi
# A setting the fragment asks for that Kconfig dropped (a dependency missing) is a wrong kernel.
missing=$(grep -E '^CONFIG_[A-Z0-9_]+=' "$fragment" | while read -r line; do
    grep -qx "$line" "$src/.config" || echo "$line"
done)
if [ -n "$missing" ]; then
    say "the kernel configuration lost: $(echo $missing)"
    exit 1
fi
# And one it turns off that something else selects back (x86 selects PERF_EVENTS, for one).
kept=$(sed -n 's/^# \(CONFIG_[A-Z0-9_]*\) is not set$/\1/p' "$fragment" | while read -r name; do
    if grep -q "^$name=" "$src/.config"; then echo "$name"; fi
done)
if [ -n "$kept" ]; then
    say "the kernel configuration still sets: $(echo $kept)"
    exit 1
fi
nice make -C "$src" -s -j"$(nproc)" vmlinux >&2
cp "$src/.config" "$cache/config"
cp "$src/vmlinux" "$cache/vmlinux.tmp"
strip --strip-debug "$cache/vmlinux.tmp"
mv "$cache/vmlinux.tmp" "$cache/vmlinux"
say "built $cache/vmlinux"
echo "$cache/vmlinux"
