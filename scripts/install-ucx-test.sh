#!/usr/bin/env bash
# make test-install-ucx (opt-in: builds the whole of UCX, 3-6 minutes on two cores the first
# time): UCX configured against an installed clowder tree alone, finding XPMEM by its
# cray-xpmem.pc, and its xpmem transport loading the installed libxpmem.so.0. make test checks
# the same route more cheaply (scripts/install-test.sh builds only UCX's xpmem transport and
# the libraries under it, xemem/ucx/build-xpmem.sh); this one also has ucp and the tools. The install and the UCX build are
# kept under build/install-ucx, so a second run only reinstalls and checks.
set -euo pipefail
cd "$(dirname "$0")/.."
base=$PWD/build/install-ucx
prefix=$base/prefix
PREFIX=$prefix SYSCONFDIR=$base/etc scripts/install.sh
UCX_BUILD_DIR=$base/ucx XPMEM_PREFIX=$prefix xemem/ucx/build.sh
transport=$base/ucx/install/lib/ucx/libuct_xpmem.so
# UCX sets no run path for XPMEM: the installed lib directory is found as ldconfig would find
# $PREFIX/lib, here by LD_LIBRARY_PATH.
loads=$(LD_LIBRARY_PATH=$prefix/lib ldd "$transport")
if ! grep -q "libxpmem.so.0 => $prefix/lib/libxpmem.so.0" <<<"$loads"; then
    echo "FAIL install-ucx: $transport does not load the installed libxpmem: $(grep xpmem <<<"$loads")" >&2
    exit 1
fi
grep -q "XPMEM_CFLAGS.*$prefix/include" "$base/ucx/obj/config.log" \
    || { echo "FAIL install-ucx: UCX's configure did not take XPMEM's flags from the installed cray-xpmem.pc" >&2; exit 1; }
echo "ok   UCX's xpmem transport built against the installed tree by pkg-config alone"
