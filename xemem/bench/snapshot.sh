#!/usr/bin/env bash
# Copy-on-write snapshots (TCASM, issue 28): what a snapshot of a 1 GiB region costs its
# writer when 1% of the region (2,621 pages spread evenly) is then rewritten, against copying
# the region; the same pages in a 256 MiB region (the cost follows the pages written, not the
# size), 0.1% and 10% of 1 GiB. Builds libxpmem and snapshot_bench.c, starts a private broker
# (unless CLOWDER_XEMEM_SOCKET names one) and writes docs/results/xemem-snapshot.md.
# REPS=9 cycles per row (medians). About 2.5 GiB of memory at once; under a minute.
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
reps=${REPS:-9}
[[ $reps =~ ^[1-9][0-9]?$ ]] || { echo "xemem/bench/snapshot.sh: REPS is a count from 1 to 99, not '$reps'" >&2; exit 2; }

make -s -C .. all >/dev/null
mkdir -p ../build/bench
cc -O2 -g -Wall -Wextra -std=gnu11 -I../build/include -o ../build/bench/snapshot_bench snapshot_bench.c \
    -L../build/lib -Wl,-rpath,"$(cd ../build/lib && pwd)" -lxpmem
scratch=$(mktemp -d)
broker_pid=
trap '[ -z "$broker_pid" ] || kill "$broker_pid" 2>/dev/null; rm -rf "$scratch"' EXIT
if [ -z "${CLOWDER_XEMEM_SOCKET:-}" ]; then
    (cd "$root" && cargo build -q -p xemem-host --bin xemem-broker)
    target=$(cd "$root" && cargo metadata --format-version 1 --no-deps |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    export CLOWDER_XEMEM_SOCKET=$scratch/xemem.sock
    "$target/debug/xemem-broker" 2>"$scratch/broker.log" &
    broker_pid=$!
    for _ in $(seq 100); do [ -S "$CLOWDER_XEMEM_SOCKET" ] && break; sleep 0.05; done
fi

load_before=$(cut -d' ' -f1 /proc/loadavg)
table() { # CLOCK
    for row in "1024 2621" "256 2621" "1024 262" "1024 26214"; do
        # shellcheck disable=SC2086 # SIZE_MIB WRITTEN_PAGES
        ../build/bench/snapshot_bench $row "$reps" "$1"
    done
}
wall=$(table wall)
cpu=$(table cpu)
echo "$wall"
echo "$cpu"
header="| region | written pages | copy of the region | make | copy-on-write | release | snapshot (share of the copy) | first make, every page mapped | refill pass (share of the copy) |
|---|---|---|---|---|---|---|---|---|"
out=$root/docs/results/xemem-snapshot.md
{
    echo "# XEMEM snapshots (TCASM): what a copy-on-write snapshot costs its writer"
    echo
    echo "\`xemem/bench/snapshot.sh\` ($(date -u +%Y-%m-%d), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'),"
    echo "$(nproc) CPUs, load average $load_before at the start; medians of $reps cycles). A region from"
    echo "\`xemem_region_alloc\` is filled once; each cycle takes a snapshot, rewrites the written pages"
    echo "(spread evenly, each wholly) and releases it. Times in ms."
    echo
    echo "Elapsed time:"
    echo
    echo "$header"
    echo "$wall"
    echo
    echo "The writer thread's CPU time (user and system), the same rows: on a loaded machine, the"
    echo "cost without the time other processes ran meanwhile (the broker's own work, two requests"
    echo "a cycle, is not in it):"
    echo
    echo "$header"
    echo "$cpu"
    cat <<'MD'

- **copy**: `memcpy` of the whole region into memory already mapped: what a reader's private
  copy would cost instead of a snapshot.
- **make**: `xemem_snapshot_make`: the writer's view of the region's memfd is mapped again
  `MAP_PRIVATE` over the same addresses and the snapshot's segment made (one broker call).
- **copy-on-write**: the rewrite under the snapshot less the same rewrite without one: the
  kernel copying each page on its first store (a fault), plus, after the release, the first
  rewrite less the same with the pages mapped (the release's remap unmapped them: a second
  fault per written page).
- **release**: `xemem_snapshot_release`: the segment removed, the writer's own pages found
  (`PAGEMAP_SCAN`) and copied into the memfd, the view mapped shared again.
- **snapshot** = make + copy-on-write + release: the issue's target is under 5% of the copy for
  1 GiB with 1% rewritten.
- **first make, every page mapped** and **refill pass** are outside that sum, and are what the
  design costs a writer that touches its whole region: both remaps drop the view's page tables,
  so a make after every page was touched pays for unmapping them (about as much as
  `mprotect` of the region would), and the first pass that reads every page after a cycle
  maps them again on first touch (about one fault per 16 pages). On this machine, a virtual
  machine whose page-table updates are expensive, both are large; a writer that rewrites 1%
  of its region and reads the rest every step pays the refill each step.
MD
    # Per written page, from the 1 GiB / 1% row of the CPU-time table.
    echo "$cpu" | awk -F'|' 'NR == 1 {
        split($3, w, " "); pages = w[1]; copy_us = $4 * 1000 / 262144
        printf "\nPer written page (1 GiB, 1%%, CPU time): the whole cycle %.2f us, of which copy-on-write and the\n", $8 * 1000 / pages
        printf "mapping again %.2f us; a 4 KiB page of the region copy costs %.2f us. Each of the two faults of a\n", $6 * 1000 / pages, copy_us
        printf "written page costs about as much as copying ten pages on this machine, which is what keeps the\n"
        printf "1%% row above the 5%% target here: the cost follows the pages written (the 256 MiB row costs what the\n"
        printf "1 GiB row with the same pages does; 0.1%% and 10%% scale with them), not the region size.\n"
    }'
} >"$out"
echo "wrote $out"
