#!/usr/bin/env bash
# Copy-on-write snapshots in the lightweight kernel (page-table copy-on-write, issue 28 point
# 3): xemem/bench/snapshot_bench.c, the host benchmark itself, built statically with musl and
# run as the LWK's job under clowder-vmm (its /dev/xpmem: regions and snapshots of the
# kernel's). Rows: 1% of 64 MiB, 256 MiB and 1 GiB rewritten (the same stride), and the same
# 164 pages in 1 GiB. Writes docs/results/xemem-snapshot-lwk.md. REPS=3 cycles per row
# (medians). Needs /dev/kvm and about 6 GiB of memory for the 1 GiB rows (the region is
# physical memory the kernel keeps apart from the job's heap); a few minutes, most of it the
# kernel clearing the region when it is freed (emulated on PVM, about 40 ms per MiB).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
reps=${REPS:-3}
[[ $reps =~ ^[1-9][0-9]?$ ]] || { echo "xemem/bench/lwk-snapshot.sh: REPS is a count from 1 to 99, not '$reps'" >&2; exit 2; }
[ -w /dev/kvm ] || { echo "xemem/bench/lwk-snapshot.sh: needs /dev/kvm" >&2; exit 1; }

headers="$root/xemem/build/musl/kernel-headers"
mkdir -p "$headers" "$root/xemem/build/bench"
ln -sfn /usr/include/linux "$headers/linux"
ln -sfn "/usr/include/$(gcc -print-multiarch)/asm" "$headers/asm"
ln -sfn /usr/include/asm-generic "$headers/asm-generic"
make -s -C "$root/xemem" CC="musl-gcc -isystem $headers" BUILD=build/musl build/musl/lib/libxpmem.a
bench="$root/xemem/build/bench/snapshot_bench.lwk"
musl-gcc -isystem "$headers" -static -O2 -Wall -I"$root/xemem/include" -o "$bench" "$here/snapshot_bench.c" \
    "$root/xemem/build/musl/lib/libxpmem.a" -lpthread
(cd "$root/kernels" && cargo build --release -p lwk --quiet)
(cd "$root" && cargo build --release -p clowder-vmm --quiet)
kernel="$root/kernels/target/x86_64-unknown-none/release/lwk"
vmm="$root/target/release/clowder-vmm"

# row SIZE_MIB WRITTEN_PAGES MEM: one table row from a VM of MEM
row() {
    timeout 900 "$vmm" --kernel "$kernel" --module "$bench" --mem "$3" \
        --cmdline "-- snapshot_bench.lwk $1 $2 $reps wall" </dev/null 2>/dev/null | tr -d '\r' | grep '^| '
}
rows=$(row 64 164 1G; row 256 655 2G; row 1024 2621 6G; row 1024 164 6G)
echo "$rows"
out=$root/docs/results/xemem-snapshot-lwk.md
{
    echo "# XEMEM snapshots in the LWK: page-table copy-on-write"
    echo
    echo "\`xemem/bench/lwk-snapshot.sh\` ($(date -u +%Y-%m-%d), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'),"
    echo "$(nproc) CPUs, load average $(cut -d' ' -f1 /proc/loadavg); clowder-vmm on this host's PVM, where the kernel's"
    echo "instructions are emulated, about 0.26 us each, and user code runs natively; medians of $reps cycles)."
    echo "The host's benchmark, \`snapshot_bench.c\`, as the LWK's job: a region from \`xemem_region_alloc\`"
    echo "is filled once; each cycle takes a snapshot, rewrites the written pages under it (spread"
    echo "evenly, each wholly) and releases it. Elapsed times in ms; the columns as in"
    echo "[xemem-snapshot.md](xemem-snapshot.md)."
    echo
    echo "| region | written pages | copy of the region | make | copy-on-write | release | snapshot (share of the copy) | first make, every page mapped | refill pass (share of the copy) |"
    echo "|---|---|---|---|---|---|---|---|---|"
    echo "$rows"
    echo
    echo "- **copy**: \`memcpy\` of the region in the job (user code, native speed)."
    echo "- **make**: \`xemem_snapshot_make\`: the first one write-protects the view and maps the shadow by"
    echo "  runs (2 MiB pages: a few table writes per GiB, *first make*); each later one write-protects"
    echo "  the pages written since and points the shadow at their frames, two page-table entries each."
    echo "- **copy-on-write**: the rewrite under the snapshot less the same rewrite again: per page a"
    echo "  write fault, a fresh frame, a 4 KiB copy and a page-table entry, in the kernel."
    echo "- **release**: \`xemem_snapshot_release\`: the segment removed, the kept frames pooled."
    echo "- **refill**: a pass reading every page after a cycle less the same pass again: the pages stay"
    echo "  mapped, and nothing flushes the whole TLB on a one-CPU job."
} >"$out"
echo "wrote $out"
