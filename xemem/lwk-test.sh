#!/usr/bin/env bash
# The same statically linked XPMEM program on the host and in the lightweight kernel.
#
# xemem/tests/same_binary.c is built once with musl-gcc against xemem/include/xpmem.h and a
# musl build of libxpmem.a. On the host the library finds no /dev/xpmem and talks to a
# private xemem-broker (the broker clowderd embeds); in the LWK it opens the kernel's
# /dev/xpmem and speaks XPMEM's ioctls. Output and exit status must be identical (the program
# ends by touching a removed segment's attachment: SIGBUS, status 135, on both).
#
#   xemem/lwk-test.sh                  # under QEMU TCG
#   RUNNER=vmm xemem/lwk-test.sh       # under clowder-vmm on /dev/kvm
#   QEMU_CPUS=2 xemem/lwk-test.sh      # the threads on two CPUs
#
# Then, in the LWK only, xemem/tests/lwk_fork_device.c: forked processes of the job each use
# the device, and XEMEM signals wake a notify descriptor. Last, xemem/tests/lwk_snapshot.c
# (snapshots: isolation, release, errors) on the host and in the LWK.
#
# Prints "N passed, N failed"; exits non-zero on any failure.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
work="$here/build/lwk-test"
runner=${RUNNER:-qemu}
qemu_cpus=${QEMU_CPUS:-1}
mkdir -p "$work"
passed=0
failed=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }

# musl has no kernel headers of its own; xpmem.h needs <asm/ioctl.h> and <linux/types.h>.
headers="$here/build/musl/kernel-headers"
mkdir -p "$headers"
ln -sfn /usr/include/linux "$headers/linux"
ln -sfn "/usr/include/$(gcc -print-multiarch)/asm" "$headers/asm"
ln -sfn /usr/include/asm-generic "$headers/asm-generic"
make -s -C "$here" CC="musl-gcc -isystem $headers" BUILD=build/musl build/musl/lib/libxpmem.a || exit 1
# build_job SOURCE: xemem/tests/SOURCE linked statically against the musl libxpmem.a, as
# $work/NAME (SOURCE without .c): the name the job then runs under
build_job() {
    musl-gcc -isystem "$headers" -static -O2 -Wall -I"$here/include" -o "$work/${1%.c}" "$here/tests/$1" \
        "$here/build/musl/lib/libxpmem.a" -lpthread
}
binary="$work/same_binary"
build_job same_binary.c || exit 1

(cd "$repo/kernels" && cargo build --release -p lwk --quiet) || exit 1
kernel="$repo/kernels/target/x86_64-unknown-none/release/lwk"
if [ "$runner" = vmm ]; then
    vmm=${CLOWDER_VMM:-$repo/target/release/clowder-vmm}
    [ -x "$vmm" ] || (cd "$repo" && cargo build --release -p clowder-vmm --quiet) || exit 1
fi
# boot BINARY CONSOLE: the LWK with BINARY as its one job (named as the file), its console in
# CONSOLE (and under clowder-vmm the VMM's stderr in CONSOLE.stderr)
boot() {
    local job
    job=$(basename "$1")
    if [ "$runner" = vmm ]; then
        timeout 120 "$vmm" --kernel "$kernel" --module "$1" --mem 256M ${VMM_ARGS:-} --cmdline "-- $job" \
            </dev/null >"$2" 2>"$2.stderr"
    else
        timeout 120 qemu-system-x86_64 -nodefaults -accel tcg -cpu max -smp "$qemu_cpus" -m 256M -display none \
            -serial stdio -no-reboot -device isa-debug-exit,iobase=0xf4,iosize=4 \
            -kernel "$kernel" -initrd "$1" -append "lwk.cpus=$qemu_cpus -- $job" </dev/null >"$2" 2>&1
    fi
}
# job_status CONSOLE: the exit status the LWK reported for its job, or nothing
job_status() { sed -n 's/^\[lwk\] job exited with status \([0-9]*\).*/\1/p' "$1" | tr -d '\r'; }
(cd "$repo" && cargo build -p xemem-host --bin xemem-broker --quiet) || exit 1

# --- the host, through a private broker
socket="$work/broker.sock"
rm -f "$socket"
"$repo/target/debug/xemem-broker" "$socket" >"$work/broker.log" 2>&1 &
broker=$!
trap 'kill $broker 2>/dev/null' EXIT
for _ in $(seq 50); do [ -S "$socket" ] && break; sleep 0.1; done
(cd "$work" && CLOWDER_XEMEM_SOCKET="$socket" CLOWDER_XEMEM_BACKEND=broker timeout 60 "$binary") >"$work/host.out" 2>&1
host_status=$?

# --- the LWK, the binary itself as the job's module
console="$work/lwk.console"
boot "$binary" "$console"
grep -v '^\[lwk\] ' "$console" | tr -d '\r' >"$work/lwk.out"
lwk_status=$(job_status "$console")

# --- compare
if [ "$host_status" = 135 ]; then pass "host: dies of SIGBUS at the end (135)"; else fail "host: status $host_status, not 135"; fi
if [ "${lwk_status:-none}" = 135 ]; then pass "lwk: dies of SIGBUS at the end (135)"; else fail "lwk: status ${lwk_status:-none}, not 135"; fi
if grep -q 'killed by SIGBUS' "$console"; then pass "lwk: the kernel reports SIGBUS"; else fail "lwk: no SIGBUS report"; fi
if ! grep -q '^FAIL' "$work/host.out" && grep -q '^version 0x26005' "$work/host.out"; then
    pass "host: every check ($(grep -c '^ok' "$work/host.out") ok lines)"
else
    fail "host: $(grep -c '^FAIL' "$work/host.out") failed checks (see $work/host.out)"
fi
# The LWK has no broker: only its /dev/xpmem can have answered the version and every call.
if grep -q '^version 0x26005' "$work/lwk.out"; then pass "lwk: /dev/xpmem answers XPMEM_CMD_VERSION"; else fail "lwk: no XPMEM version (device not found?)"; fi
if grep -q 'unimplemented system call' "$console"; then fail "lwk: $(grep -m1 'unimplemented system call' "$console")"; else pass "lwk: no unimplemented system call"; fi
if diff -u "$work/host.out" "$work/lwk.out" >"$work/diff"; then
    pass "same output on the host and in the LWK ($(wc -l <"$work/host.out") lines)"
else
    fail "outputs differ:"; cat "$work/diff"
fi

# --- LWK only: forked processes on the device and XEMEM signals between them, standalone
# (the enclave its own name server). xemem_lwk runs the same job in a connected enclave.
build_job lwk_fork_device.c || exit 1
fork_console="$work/lwk-fork.console"
boot "$work/lwk_fork_device" "$fork_console"
fork_status=$(job_status "$fork_console")
if [ "${fork_status:-none}" = 0 ] && grep -q '^lwk_fork_device: all passed' "$fork_console" && ! grep -q '^FAIL' "$fork_console"; then
    pass "lwk: forked processes each use the device, signals wake a notify descriptor ($(grep -c '^ok' "$fork_console") checks)"
else
    fail "lwk: lwk_fork_device status ${fork_status:-none}: $(grep -m3 '^FAIL' "$fork_console" | tr '\n' ' ')(see $fork_console)"
fi

# --- snapshots (TCASM): the same binary on the host (through the private broker) and in the
# LWK (page-table copy-on-write in the kernel); each prints a line per check.
build_job lwk_snapshot.c || exit 1
(cd "$work" && CLOWDER_XEMEM_SOCKET="$socket" CLOWDER_XEMEM_BACKEND=broker timeout 60 "$work/lwk_snapshot") \
    >"$work/snapshot-host.out" 2>&1
snapshot_host=$?
snapshot_console="$work/lwk-snapshot.console"
boot "$work/lwk_snapshot" "$snapshot_console"
snapshot_status=$(job_status "$snapshot_console")
for side in host lwk; do
    if [ "$side" = host ]; then out="$work/snapshot-host.out" status=$snapshot_host; else out="$snapshot_console" status=${snapshot_status:-none}; fi
    if [ "$status" = 0 ] && grep -q '^lwk_snapshot: all passed' "$out" && ! grep -q '^FAIL' "$out"; then
        pass "$side: snapshots isolate their readers from the writer's stores, errors for bad input ($(grep -c '^ok' "$out") checks)"
    else
        fail "$side: lwk_snapshot status $status: $(grep -m3 '^FAIL' "$out" | tr '\n' ' ')(see $out)"
    fi
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
