#!/usr/bin/env bash
# Boots the test guest under QEMU (TCG, no KVM) and checks the tests that need no clowder-vmm
# device: the same image must behave the same outside our VMM (PVH entry, INIT/SIPI, serial,
# exit port, exceptions). QEMU's isa-debug-exit reports status N as (N << 1) | 1.
#   kernels/testguest/qemu-test.sh [IMAGE]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
image="${1:-$("$here/../build.sh" testguest)}"
if ! command -v qemu-system-x86_64 >/dev/null; then
    echo "qemu-test: skipped, qemu-system-x86_64 is not installed" >&2
    exit 0
fi
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
failures=0

# check NAME CMDLINE GUEST_STATUS EXPECTED_OUTPUT_LINE [QEMU_ARGS...]
check() {
    local name="$1" cmdline="$2" status="$3" line="$4"
    shift 4
    local qemu_status=0
    timeout 60 qemu-system-x86_64 -accel tcg -m 128 -display none -serial "file:$log" -no-reboot \
        -device isa-debug-exit,iobase=0xf4,iosize=4 -kernel "$image" -append "$cmdline" "$@" \
        </dev/null >/dev/null 2>&1 || qemu_status=$?
    local expected_status=$(( status < 0 ? 0 : (status << 1) | 1 ))
    if [ "$qemu_status" -ne "$expected_status" ] || ! grep -qxF -- "$line" "$log"; then
        echo "qemu-test: $name FAILED (QEMU status $qemu_status, expected $expected_status; wanted line '$line')" >&2
        sed 's/^/    /' "$log" >&2
        failures=$((failures + 1))
    else
        echo "qemu-test: $name ok"
    fi
}

check serial      "test=serial lines=2"   0   "serial: line 2 of 2"
check exit        "test=exit status=42"   42  "testguest: test=exit vcpu=0 boot=pvh"
check pvh         "test=pvh"              0   "pvh: cmdline 'test=pvh'"
check sipi        "test=sipi cpus=4"      0   "sipi: 4 of 4 cpus arrived"   -smp 4
check unknown     "test=nonsense"         2   "testguest: unknown test 'nonsense'"
check nochannel   "test=channel"          3   "channel: no clowder.channel=<gpa>,<size> on the command line"
# A triple fault resets the machine; with -no-reboot QEMU then exits with status 0.
check triplefault "test=triplefault"      -1  "triplefault: now"

[ "$failures" -eq 0 ]
