#!/usr/bin/env bash
# The repository's scripts name a mistake in their arguments or settings with status 2 before
# they start anything (build, daemon, benchmark). Each case: expected text | command.
set -uo pipefail
cd "$(dirname "$0")/.."
failures=0 cases=0
while IFS='|' read -r expected command; do
    cases=$((cases + 1))
    output=$(timeout 20 bash -c "$command" 2>&1)
    status=$?
    if [ $status != 2 ] || ! grep -qF -- "$expected" <<<"$output"; then
        failures=$((failures + 1))
        echo "FAIL $command: status $status, said: $(head -2 <<<"$output")"
    fi
done <<'CASES'
unknown option '--fast'|scripts/insitu.sh --fast
NX must be a whole number from 1 up, not 'big'|scripts/insitu.sh big 32 32
--repeat must be a whole number from 1 up, not '0'|scripts/insitu.sh --repeat 0
at most six numbers|scripts/insitu.sh 1 2 3 4 5 6 7
INTERVAL (50) is longer than ITERATIONS (40)|scripts/insitu.sh 32 32 32 40 50
unknown configuration 'z'|scripts/insitu.sh --config a,z
unknown workflow 'sync-twice'|scripts/insitu.sh --workflow sync-twice
--data-mb is a size in MiB from 0 to 512, not '1024'|scripts/insitu.sh --data-mb 1024
usage: scripts/linux-kernel.sh [initramfs]|scripts/linux-kernel.sh kernel
runs must be a whole number from 1 up, not 'many'|dex/bench/run.sh many
usage: |dex/bench/run.sh 5 everything
POLL_US must be a whole number of microseconds from 1 to 1000000, not '5ms'|POLL_US=5ms dex/bench/run.sh 1 latency
ATTACHES must be a whole number from 1 up, not '1e3'|ATTACHES=1e3 xemem/bench/run.sh
SIZES takes region sizes in MiB (128 256 512 1024), not '1G'|SIZES="128 1G" xemem/bench/run.sh
CROSS is 0 (host only) or 1, not 'no'|CROSS=no xemem/bench/run.sh
REPS is a count from 1 to 99, not 'x'|REPS=x xemem/bench/snapshot.sh
RUNS must be whole numbers from 1 up, not '0'|RUNS=0 bench/xemem/vm-table2.sh
SECONDS must be a positive number, not 'soon'|scripts/lwk-kernel-profile.sh soon
NZ must be a whole number from 1 up, not 'x'|scripts/adios2-demo.sh 1 2 x 4 5
SIZES, STEPS, PAUSE_MS and RUNS take whole numbers from 1, not 'big'|SIZES="4 big" coupling/bench/run.sh
apps/mpi/bench.sh: --iters must be a whole number from 1 up, not 'x'|apps/mpi/bench.sh --iters x
apps/mpi/bench.sh: --cg must be a whole number from 4 up, not '3'|apps/mpi/bench.sh --cg 3
apps/mpi/bench.sh: --limit must be a whole number from 1 up, not ''|apps/mpi/bench.sh --limit
unknown option '--fast' (--max-bytes N, --iters N, --cg N, --cg-rounds N, --pingpong-rounds N, --user-level, --cg-only, --small-pages, --limit S)|apps/mpi/bench.sh --fast
apps/mpi/ucx-loop.sh: --runs must be a whole number from 1 up, not '0'|apps/mpi/ucx-loop.sh --runs 0
apps/mpi/ucx-loop.sh: --bytes must be a whole number from 1 up, not '4k'|apps/mpi/ucx-loop.sh --bytes 4k
unknown option '--fast' (--runs N, --bytes N, --keep DIR, --hugepages, --plain)|apps/mpi/ucx-loop.sh --fast
CASES
if [ $failures = 0 ]; then
    echo "ok   scripts and benchmarks name bad arguments ($cases cases)"
else
    echo "$failures of $cases argument checks failed"
    exit 1
fi
