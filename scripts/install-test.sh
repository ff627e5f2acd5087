#!/usr/bin/env bash
# make install, tested (part of make test): install into a temporary DESTDIR and check
#  - the file list, and that nothing installed names the source tree;
#  - the systemd unit (systemd-analyze verify, against the installed tree);
#  - an XPMEM program built with `pkg-config --cflags --libs cray-xpmem` against the installed
#    tree alone, and a DEX program built with the installed dexcc and run by the installed dexrun;
#  - UCX's xpmem transport built from Debian's UCX source finding XPMEM by pkg-config alone
#    (xemem/ucx/build-xpmem.sh: ~3 minutes the first time, cached under build/ucx-xpmem), loading
#    the installed libxpmem.so.0;
#  - the demo from a copy of the installed tree moved elsewhere, with the source tree out of the
#    way (an empty tmpfs over it, in a mount namespace of its own): clowderd (only the
#    PREFIX-relative kernel lookup can find the LWK), configured by a file whose one setting a
#    flag overrides, creates an enclave and runs the CG simulation in it; the XPMEM program and
#    UCX's xpmem transport use its broker.
# Needs a built tree (make build) and root (UCX's source comes by apt-get source); the daemon
# part needs /dev/kvm and says when it skips.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
work=$(mktemp -d /tmp/clowder-install-test.XXXXXX)
# A fixed DESTDIR, so that the cached UCX build stays configured for it.
dest=$top/build/install-test
rm -rf "$dest"
cleanup() {
    rm -rf "$work" "$dest"
}
trap cleanup EXIT
fail() { echo "FAIL install: $*" >&2; exit 1; }
# Under pipefail, `cmd | grep -q` fails when grep stops reading early: checks read "$(cmd)".

PREFIX=/usr/local DESTDIR=$dest scripts/install.sh 2>"$work/install.log" || { cat "$work/install.log" >&2; fail "make install failed"; }
prefix=$dest/usr/local

# The file list; dex's UCX and PMIx modules exist where their libraries are installed.
expected="etc/clowder/clowderd.toml
usr/local/bin/clowder
usr/local/bin/clowder-vmm
usr/local/bin/clowderd
usr/local/bin/dexcc
usr/local/bin/dexnode
usr/local/bin/dexrun
usr/local/include/dex.h
usr/local/include/migrate.h
usr/local/include/xpmem.h
usr/local/lib/clowder/lwk
usr/local/lib/dex/dex_start.o
usr/local/lib/libdex.so
usr/local/lib/libdex.so.0
usr/local/lib/libxpmem.a
usr/local/lib/libxpmem.so
usr/local/lib/libxpmem.so.0
usr/local/lib/libxpmem.so.0.0.0
usr/local/lib/pkgconfig/cray-xpmem.pc
usr/local/lib/pkgconfig/xpmem.pc
usr/local/lib/systemd/system/clowderd.service
usr/local/share/doc/clowder/clowderd.toml
usr/local/share/man/man1/clowder-vmm.1
usr/local/share/man/man1/clowder.1
usr/local/share/man/man1/dexcc.1
usr/local/share/man/man1/dexnode.1
usr/local/share/man/man1/dexrun.1
usr/local/share/man/man8/clowderd.8"
for module in libdex-ucx.so libdex-pmix.so; do
    [ -e "dex/build/$module" ] && expected+=$'\n'"usr/local/lib/$module"
done
actual=$(cd "$dest" && find . \( -type f -o -type l \) | sed 's|^\./||' | LC_ALL=C sort)
diff <(LC_ALL=C sort <<<"$expected") <(echo "$actual") >"$work/list.diff" || { cat "$work/list.diff" >&2; fail "installed files differ from the list (< expected, > installed)"; }
[ "$(readlink "$prefix/lib/libxpmem.so")" = libxpmem.so.0 ] || fail "libxpmem.so does not link to libxpmem.so.0"
grep -q 'SONAME *libdex.so.0' <<<"$(objdump -p "$prefix/lib/libdex.so.0")" || fail "libdex.so.0 has no soname libdex.so.0"
if grep -rlF "$top" "$dest" >"$work/leaks"; then fail "installed files name the source tree $top: $(tr '\n' ' ' <"$work/leaks")"; fi
grep -q "^ExecStart=/usr/local/bin/clowderd$" "$prefix/lib/systemd/system/clowderd.service" || fail "the unit's ExecStart is not the installed clowderd"
# Verified against the host's units (a DESTDIR has no sysinit.target), with the command's path
# moved into the DESTDIR so that its existence is checked too.
if command -v systemd-analyze >/dev/null; then
    mkdir -p "$work/unit"
    sed "s|^ExecStart=|ExecStart=$dest|" "$prefix/lib/systemd/system/clowderd.service" >"$work/unit/clowderd.service"
    systemd-analyze verify --man=no "$work/unit/clowderd.service" >"$work/verify.log" 2>&1 \
        || { cat "$work/verify.log" >&2; fail "systemd-analyze verify refused clowderd.service"; }
else
    echo "install-test: systemd-analyze is absent: clowderd.service only checked for its ExecStart"
fi
# Each page has a title and the program's own options, as troff writes them.
for page_option in 'man1/clowder.1 enclave' 'man1/clowder-vmm.1 \-\-kernel' 'man1/dexrun.1 \-\-transport' 'man1/dexnode.1 \-\-secret\-file' 'man1/dexcc.1 DEX_BUILD' 'man8/clowderd.8 \-\-config'; do
    read -r page option <<<"$page_option"
    grep -q '^\.TH' "$prefix/share/man/$page" && grep -qF -- "$option" "$prefix/share/man/$page" \
        || fail "$page lacks a title or $option"
done

# Everything from here on runs from a copy of the prefix moved elsewhere: a program that still
# depended on /usr/local or the build directory would fail.
moved=$work/elsewhere/opt-clowder
mkdir -p "$(dirname "$moved")"
cp -a "$prefix" "$moved"

cat >"$work/xpmem-hello.c" <<'EOF'
#include <stdio.h>
#include <stdlib.h>
#include <xpmem.h>
/* Shares a page through the broker (when given one) and takes the share back. */
int main(int argc, char **argv)
{
	static char page[4096] __attribute__((aligned(4096)));
	printf("xpmem version %x\n", xpmem_version());
	if (argc > 1) {
		xpmem_segid_t segid = xpmem_make(page, sizeof(page), XPMEM_PERMIT_MODE, (void *)0600);
		if (segid <= 0 || xpmem_remove(segid) != 0) {
			perror("xpmem_make/xpmem_remove");
			return 1;
		}
		printf("xpmem segment made and removed\n");
	}
	return 0;
}
EOF
flags=$(PKG_CONFIG_PATH="$moved/lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR= pkg-config --define-prefix --cflags --libs cray-xpmem)
case "$flags" in *"$moved/include"*"$moved/lib"*) ;; *) fail "pkg-config cray-xpmem gave '$flags', not the installed tree's paths" ;; esac
# shellcheck disable=SC2086 # the flags are words
cc -o "$work/xpmem-hello" "$work/xpmem-hello.c" $flags -Wl,-rpath,"$moved/lib" || fail "an XPMEM program does not build from pkg-config alone"
grep -q "libxpmem.so.0 => $moved/lib/libxpmem.so.0" <<<"$(ldd "$work/xpmem-hello")" || fail "the XPMEM program does not load the installed libxpmem.so.0"
grep -q '^xpmem version' <<<"$("$work/xpmem-hello")" || fail "the XPMEM program does not run"

printf '#include <stdio.h>\nint main(void) { puts("dex hello"); return 0; }\n' >"$work/dex-hello.c"
"$moved/bin/dexcc" -o "$work/dex-hello" "$work/dex-hello.c" || fail "the installed dexcc cannot build a DEX program"
grep -q "libdex.so.0 => $moved/lib/libdex.so.0" <<<"$(ldd "$work/dex-hello")" || fail "a dexcc program does not load the installed libdex.so.0"
[ "$(timeout 60 "$moved/bin/dexrun" -n 2 "$work/dex-hello")" = "dex hello" ] || fail "the installed dexrun does not run a DEX program on 2 nodes"
echo "ok   make install: file list, no source-tree paths, unit verified, XPMEM by pkg-config, dexcc + dexrun from the installed tree"

# UCX's xpmem transport: configured with the installed cray-xpmem.pc as the one way to XPMEM
# (pkg-config's sysroot is the DESTDIR), then run from a copy beside the moved tree.
[ "$(id -u)" -eq 0 ] || { echo "install-test: UCX and the installed clowderd not tried: they need root"; exit 0; }
ucx_stage=$(XPMEM_PREFIX=$prefix PKG_CONFIG_SYSROOT_DIR=$dest xemem/ucx/build-xpmem.sh) || fail "UCX's xpmem transport did not build against the installed tree"
grep -q "^XPMEM_CFLAGS='-I$prefix/include" "$ucx_stage/../obj/config.log" \
    || fail "UCX's configure did not take XPMEM's flags from the installed cray-xpmem.pc"
cp -a "$ucx_stage" "$work/ucx"
grep -q "libxpmem.so.0 => $moved/lib/libxpmem.so.0" <<<"$(LD_LIBRARY_PATH=$moved/lib ldd "$work/ucx/lib/ucx/libuct_xpmem.so.0")" \
    || fail "UCX's xpmem transport does not load the installed libxpmem.so.0"
echo "ok   make install: UCX's xpmem transport built against the installed tree by pkg-config alone"

if [ ! -e /dev/kvm ]; then
    echo "install-test: the installed clowderd not run: it needs /dev/kvm"
    exit 0
fi
cp build/apps/hpccg "$work/hpccg" || fail "no build/apps/hpccg (make -C apps)"
# A 1 ms hello timeout in the file would fail every enclave: the flag's 60 s must win.
cat >"$work/clowderd.toml" <<EOF
socket = "$work/run/clowderd.sock"
hello-timeout = 1
EOF
mkdir -p "$work/run"
# The demo runs in a mount namespace where an empty tmpfs covers the source tree: whatever
# installed still reached into it would find nothing there.
cat >"$work/demo.sh" <<'DEMO'
set -euo pipefail
mount -t tmpfs -o size=1M,mode=0755 clowder-source-hidden "$top"
[ -z "$(ls -A "$top")" ] || { echo "the source tree is still visible" >&2; exit 1; }
cd "$work"
fail() { echo "FAIL install: $*" >&2; exit 1; }
env -u CLOWDER_KERNEL -u CLOWDER_VMM -u CLOWDER_SOCKET -u CLOWDER_XEMEM_SOCKET \
    "$moved/bin/clowderd" --config "$work/clowderd.toml" --hello-timeout 60000 >"$work/clowderd.log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null' EXIT
for _ in $(seq 200); do [ -S "$work/run/clowderd.sock" ] && break; sleep 0.05; done
[ -S "$work/run/clowderd.sock" ] || { cat "$work/clowderd.log" >&2; fail "the installed clowderd did not listen on the socket its configuration names"; }
export CLOWDER_SOCKET=$work/run/clowderd.sock CLOWDER_XEMEM_SOCKET=$work/run/xemem.sock
"$moved/bin/clowder" enclave create --name sim --cores 1 --mem 256M >"$work/create.log" 2>&1 \
    || { cat "$work/create.log" "$work/clowderd.log" >&2; fail "the installed clowderd cannot create an enclave"; }
output=$(timeout 120 "$moved/bin/clowder" run sim ./hpccg 24 24 24 2>&1) || true
grep -q '^hpccg: solution verified' <<<"$output" || { echo "$output" >&2; cat "$work/clowderd.log" >&2; fail "the CG simulation in the installed daemon's enclave did not verify"; }
grep -q 'made and removed' <<<"$("$work/xpmem-hello" broker)" || fail "the XPMEM program cannot use the installed daemon's broker"
transports=$(LD_LIBRARY_PATH=$moved/lib "$work/ucx/bin/list_transports")
grep -q '^xpmem/xpmem: xpmem on memory$' <<<"$transports" || fail "UCX lists no xpmem transport over the installed daemon's broker: $transports"
"$moved/bin/clowder" enclave rm sim >/dev/null || fail "the enclave could not be removed"
DEMO
top=$top work=$work moved=$moved unshare --mount --propagation private bash "$work/demo.sh" || exit 1
echo "ok   make install: the demo from a moved copy of the installed tree, the source tree hidden: clowderd (its own LWK, its configuration file) runs the CG simulation in an enclave; XPMEM and UCX's xpmem transport use its broker"
