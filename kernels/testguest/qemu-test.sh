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
# The ring-3 echo loop needs a channel; QEMU has no clowder device, so a pre-filled one is loaded
# into RAM: the crates/channel layout (64 KiB, 256-byte slots, 120 per ring) with "hello" and
# "quit" already queued by the "host", whose waiting flag is set so the guest rings the doorbell
# from ring 3 (port 0x520, which QEMU ignores). The guest echoes one message, answers "bye" and
# reports as in every channel mode; a stray ring-3 access to kernel memory would be a #PF.
channel_image="$(mktemp)"
trap 'rm -f "$log" "$channel_image"' EXIT
put() { printf "$2" | dd of="$channel_image" bs=1 seek=$(($1)) conv=notrunc status=none; }
truncate -s 64K "$channel_image"
put 0x0000 'CLWDCHAN'                             # magic
put 0x0008 '\001\000\000\000'                         # version 1
put 0x000c '\000\001\000\000'                         # slot size 256
put 0x0010 '\000\000\001\000\000\000\000\000'         # region size 0x10000
put 0x0018 '\170\000\000\000'                         # 120 slots per ring
put 0x00c0 '\001\000\000\000'                         # guest->host ring: the host waits
put 0x0100 '\002\000\000\000\000\000\000\000'         # host->guest ring: 2 messages produced
put 0x8800 '\005\000\000\000\000\000\000\000hello'    # host->guest slot 0 (ring at 0x1000 + 120 * 256)
put 0x8900 '\004\000\000\000\000\000\000\000quit'     # host->guest slot 1
check ring3echo   "test=channel mode=poll-user clowder.channel=4000000,10000" 0 \
    "channel: quit after 1 echoes, 0 wakeups" \
    -device loader,file="$channel_image",addr=0x4000000,force-raw=on

# A triple fault resets the machine; with -no-reboot QEMU then exits with status 0.
check triplefault "test=triplefault"      -1  "triplefault: now"

[ "$failures" -eq 0 ]
