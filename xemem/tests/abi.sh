#!/usr/bin/env bash
# The library's ABI as packagers and build systems see it: libxpmem.so.0 exports exactly the
# symbols of src/libxpmem.map (upstream XPMEM's nine plus XEMEM's extensions), its soname is
# libxpmem.so.0 with libxpmem.so -> libxpmem.so.0, the static library defines nothing else
# global, and a program builds from `pkg-config --cflags --libs cray-xpmem` (and xpmem) alone
# and runs. Exits non-zero on the first difference.
set -eu
cd "$(dirname "$0")/.."
make -s all >/dev/null
fail() { echo "abi: $*" >&2; exit 1; }

expected=$(sed -n 's/^[[:space:]]*\([a-z_][a-z0-9_]*\);$/\1/p' src/libxpmem.map | sort)
for upstream in xpmem_init xpmem_ioctl xpmem_version xpmem_make xpmem_remove xpmem_get xpmem_release \
    xpmem_attach xpmem_detach; do
    grep -qx "$upstream" <<<"$expected" || fail "the version script lacks upstream's $upstream"
done
exported=$(nm -D --defined-only build/lib/libxpmem.so.0 | awk '$2 ~ /^[TWDBVR]$/ {print $3}' | sed 's/@.*//' | sort)
[ "$exported" = "$expected" ] || fail "exported symbols differ from src/libxpmem.map:
$(diff <(echo "$expected") <(echo "$exported"))"
static=$(nm --defined-only build/lib/libxpmem.a | awk '$2 ~ /^[TWDBVR]$/ {print $3}' | sort)
[ "$static" = "$expected" ] || fail "libxpmem.a defines more than the API:
$(diff <(echo "$expected") <(echo "$static"))"

soname=$(readelf -d build/lib/libxpmem.so.0 | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libxpmem.so.0 ] || fail "soname is '$soname', not libxpmem.so.0"
[ "$(readlink build/lib/libxpmem.so)" = libxpmem.so.0 ] || fail "libxpmem.so does not point at libxpmem.so.0"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cat >"$scratch/probe.c" <<'C'
#include <stdio.h>
#include <xpmem.h>
/* Every upstream entry point links; xpmem_ioctl's unknown command is refused, not sent anywhere. */
int main(void)
{
	void *api[] = { (void *)xpmem_init, (void *)xpmem_version, (void *)xpmem_make, (void *)xpmem_remove,
			(void *)xpmem_get, (void *)xpmem_release, (void *)xpmem_attach, (void *)xpmem_detach };
	int dummy = 0;
	if (xpmem_ioctl(0x12345, &dummy) != -1)
		return 1;
	printf("%zu\n", sizeof api / sizeof *api);
	return 0;
}
C
export PKG_CONFIG_PATH=$PWD/build/lib/pkgconfig
for package in cray-xpmem xpmem; do
    # shellcheck disable=SC2046 # pkg-config's output is a list of flags
    cc -o "$scratch/probe" "$scratch/probe.c" $(pkg-config --cflags --libs $package) ||
        fail "a program does not build with pkg-config --cflags --libs $package"
    [ "$(CLOWDER_XEMEM_BACKEND=broker LD_LIBRARY_PATH=$PWD/build/lib "$scratch/probe")" = 8 ] ||
        fail "the program built with $package does not run"
done
echo "abi: $(wc -l <<<"$expected") symbols exported as listed, soname libxpmem.so.0, pkg-config builds"
