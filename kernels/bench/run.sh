#!/usr/bin/env bash
# Issue 3's benchmarks: the same static binaries on the host and in an LWK enclave.
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s -C apps >/dev/null
# The 1 GiB enclaves run on 2 MiB pages, as an LWK gives them, when 512 hugepages are free.
# (The creation-time rows grow the pool for their 2m enclaves themselves, and only then.)
free_huge=$(cat /sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages 2>/dev/null || echo 0)
if [ "${1:-}" != big ] && [ "$free_huge" -lt 544 ] && [ "$(id -u)" -eq 0 ]; then
    pool=$(cat /proc/sys/vm/nr_hugepages)
    trap 'echo "$pool" > /proc/sys/vm/nr_hugepages' EXIT # the pool as it was
    echo $(( pool + 544 - free_huge )) > /proc/sys/vm/nr_hugepages || true
fi
# `kernels/bench/run.sh big`: only the creation time per GiB.
target/release/lwk-bench "$@"
[ "${1:-}" = big ] || python3 bench/plot.py lwk
