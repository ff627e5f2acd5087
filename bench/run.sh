#!/usr/bin/env bash
# Runs every benchmark; each prints its table (our figure beside the paper's) and writes its
# results file under docs/results/.
set -euo pipefail
cd "$(dirname "$0")/.."

# Rows backed by 2 MiB pages need free hugepages; reserve a few if we may.
free_huge=$(cat /sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages 2>/dev/null || echo 0)
if [ "$free_huge" -lt 64 ] && [ "$(id -u)" -eq 0 ]; then
    pool=$(cat /proc/sys/vm/nr_hugepages)
    trap 'echo "$pool" > /proc/sys/vm/nr_hugepages' EXIT # the pool as it was
    echo $(( pool + 64 - free_huge )) > /proc/sys/vm/nr_hugepages
fi

echo "== clowder-vmm =="
target/release/vmm-bench
for script in kernels/bench/run.sh xemem/bench/run.sh xemem/bench/snapshot.sh bench/xemem/vm-table2.sh dex/bench/run.sh bench/insitu/run.sh coupling/bench/run.sh apps/mpi/bench.sh; do
    [ -x "$script" ] || continue
    echo "== ${script%/run.sh} =="
    "$script"
done
