#!/usr/bin/env bash
# Runs make test-mpi's UCX case (Open MPI's UCX PML over UCX's xpmem transport, one rank in each
# of enclaves a and b of one node) N times in a row on one private node, and keeps the output
# of every failing run with the ranks' UCX and PMIx diagnostics and the enclaves' logs: the
# regression check for the MPI_Init failures of about one run in eight (docs/mpi.md, "UCX
# between enclaves a and b"), and the way to look at one that comes back.
#   apps/mpi/ucx-loop.sh [--runs N] [--bytes N] [--keep DIR] [--hugepages] [--plain]
#     (10, 4194304 as test-mpi, build/ucx-loop). --hugepages: enclaves on 2 MiB hugepages (512
#     MiB each; the pool is grown by what they need and given back at the end). --plain: without
#     the diagnostics (they change the timing), exactly test-mpi's run.
# Each run takes 15-90 s on two loaded cores. Passes when every run verified its data and ended
# by itself (status 0). Needs root and /dev/kvm.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
runs=10 bytes=4194304 plain=0 keep=$root/build/ucx-loop memory=(--mem 1G)
. scripts/lib/whole.sh
whole() { whole_number apps/mpi/ucx-loop.sh "$1" "$2" 1; } # NAME VALUE
while [ $# -gt 0 ]; do
    case $1 in
    --runs) whole --runs "${2:-}" && runs=$2 && shift 2 ;;
    --bytes) whole --bytes "${2:-}" && bytes=$2 && shift 2 ;;
    --keep) [ -n "${2:-}" ] || { echo "apps/mpi/ucx-loop.sh: --keep needs a directory" >&2; exit 2; }
        keep=$2 && shift 2 ;;
    --hugepages) memory=(--mem 512M --hugepages) && shift ;;
    --plain) plain=1 && shift ;;
    *) echo "apps/mpi/ucx-loop.sh: unknown option '$1' (--runs N, --bytes N, --keep DIR, --hugepages, --plain)" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] && [ -e /dev/kvm ] || { echo "apps/mpi/ucx-loop.sh: needs root and /dev/kvm" >&2; exit 1; }

. scripts/nodes.sh
trap nodes_down EXIT
trap 'exit 1' INT TERM
make -s -C apps/mpi >/dev/null || { echo "apps/mpi/ucx-loop.sh: apps/mpi does not build" >&2; exit 1; }
xemem/ucx/build.sh >/dev/null 2>&1 || { echo "apps/mpi/ucx-loop.sh: xemem/ucx/build.sh failed" >&2; exit 1; }
bin=$root/build/apps/mpi/openmpi
CLOWDER=$root/target/release/clowder CLOWDERD=$root/target/release/clowderd
if [ "${memory[2]:-}" = --hugepages ]; then
    nodes_hugepages 512 || exit 1 # two enclaves of 256 pages
fi
nodes_up 1 && nodes_clowderd 1 || { echo "apps/mpi/ucx-loop.sh: cannot make the node" >&2; exit 1; }
for e in a b; do
    nodes_exec 1 "$CLOWDER" enclave create --name "$e" --cores 1 "${memory[@]}" >/dev/null ||
        { echo "apps/mpi/ucx-loop.sh: enclave $e cannot be made" >&2; exit 1; }
done
mkdir -p "$keep"
cd "$NODES_DIR"

# As scripts/mpi-test.sh's ucx_pair, with the diagnostics on unless --plain: UCX's at info
# (its errors and settings; debug is pages per run), Open MPI's UCX PML's, PMIx's client's and
# libxpmem's (each failed call and why).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PMIX_MCA_gds=hash
export UCX_TLS=self,xpmem LD_LIBRARY_PATH="$root/build/ucx/install/lib:$root/xemem/build/lib"
export_diagnostics=() job_diagnostics=()
if [ $plain = 0 ]; then
    export UCX_LOG_LEVEL=info OMPI_MCA_pml_ucx_verbose=100 PMIX_MCA_pmix_client_base_verbose=2 CLOWDER_LOG=xemem=debug
    export_diagnostics=(-x UCX_LOG_LEVEL -x CLOWDER_LOG) job_diagnostics=(--env CLOWDER_LOG)
fi
failed=0
for i in $(seq "$runs"); do
    nodes_wait_for 30 nodes_enclaves_idle || echo "apps/mpi/ucx-loop.sh: an enclave still runs an earlier job" >&2
    log=$NODES_DIR/run.log start=$SECONDS
    # test-mpi's limit is 120 s. A rank still running then has its clowder run killed while
    # mpirun lives (nodes_limited), so the daemon kills the job and its kernel reports every
    # thread (state, user RIP and stack).
    nodes_limited 120 nodes_exec 1 mpirun --oversubscribe --mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any \
        --mca btl self -x UCX_TLS -x LD_LIBRARY_PATH "${export_diagnostics[@]}" \
        -n 1 "$CLOWDER" run --enclave a --env LD_LIBRARY_PATH "${job_diagnostics[@]}" "$bin/pingpong" "$bytes" 20 : \
        -n 1 "$CLOWDER" run --enclave b --env LD_LIBRARY_PATH "${job_diagnostics[@]}" "$bin/pingpong" "$bytes" 20 >"$log" 2>&1
    status=$?
    if [ $status = 0 ] && grep -q "data verified" "$log"; then
        echo "run $i: ok ($((SECONDS - start)) s)"
        continue
    fi
    failed=$((failed + 1))
    kept=$keep/run-$i-$(date +%H%M%S)
    # A killed job's threads (state, user RIP and stack) are in its enclave's log once it ended.
    nodes_wait_for 30 nodes_enclaves_idle
    mkdir -p "$kept" && cp "$log" "$kept/mpirun.log" && cp "$NODES_DIR/n1/clowderd.log" "$kept/clowderd.log"
    for e in a b; do nodes_exec 1 "$CLOWDER" logs "$e" >"$kept/enclave-$e.log" 2>&1; done
    why=$(grep -m1 -E 'procs failed|ep failed|failed to|ucp_ep_create|[Tt]imed out|error occurred' "$log" | cut -c1-140)
    if [ $status = 124 ]; then
        why="timed out"
        grep -q "data verified" "$log" && why="timed out after its data was verified (MPI_Finalize did not return)"
    fi
    echo "run $i: FAILED (status $status, $((SECONDS - start)) s): $why; kept in $kept"
done
echo "ucx-loop: $((runs - failed)) of $runs runs passed"
[ $failed = 0 ]
