#!/usr/bin/env bash
# make test-mpi: unmodified MPI programs (apps/mpi, Debian's Open MPI) started by the ordinary
# launchers, on "nodes" made here (scripts/nodes.sh: two network namespaces on a bridge, each
# with its own clowderd, sshd and slurmd), first as host ranks, then with ranks in LWK enclaves
# through `clowder run` (issue 25):
#   host   mpirun over ssh across the nodes: ping-pong and mpicg verified; srun -N 2 the same;
#          a crashing rank ends the job with mpirun's usual "exited on signal" error
#   enclave  MPMD one rank per enclave; two and four ranks in one enclave; a host rank beside an enclave
#          rank (over TCP, and over Open MPI's shared-memory transport vader); vader between
#          enclaves a and b and between two ranks in one enclave; mpirun over ssh
#          and srun with a rank in each node's enclave; a crashing enclave rank ends the job with
#          the same error, and the enclave runs the next job
#   ucx    Open MPI's UCX PML over UCX's xpmem transport between two enclaves (the user-level
#          data path: no TCP, no enclave kernel per message), ping-pong 1 B..4 MiB verified; the
#          same between two enclaves on 2 MiB hugepages
# Enclave ranks need sockets in LWK jobs (PMIx wire-up over a Unix socket, the TCP transport)
# and an interface to bind (the LWK lists /proc/net/if_inet6 alone: the nodes' IPv6 addresses):
# where a probe job in the enclave finds them missing, those cases say BLOCKED and why, and pass
# nothing. Four ranks in one enclave are four jobs at once there, each with a heap of its own
# size (a job alone takes most of the enclave's memory by default), and take minutes.
# Enclave cases select TCP (--mca btl tcp,self) and PMIx's hash store (PMIX_MCA_gds=hash: its
# shared-memory store is not tried in enclaves); the vader cases use Open MPI's shared-memory
# transport over MAP_SHARED /dev/shm files instead of TCP.
# Needs root and /dev/kvm (enclave cases); what it needs from apt, scripts/bootstrap.sh installs.
# MPI_ONLY=TEXT runs only the cases whose description contains TEXT (MPI_ONLY=UCX: the UCX case;
# MPI_ONLY=MPICH: scripts/mpich-test.sh's, all of them).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. scripts/nodes.sh
trap nodes_down EXIT
trap 'exit 1' INT TERM

make -s -C apps/mpi >/dev/null || { echo "FAIL mpi: apps/mpi does not build"; exit 1; }
bin=$root/build/apps/mpi/openmpi
clowder=$root/target/release/clowder
CLOWDERD=$root/target/release/clowderd
out=$NODES_DIR/out
. scripts/lib/mpi-cases.sh
check() { mpi_case "" "$@"; } # description command...: a case of host ranks

nodes_up 2 || { echo "FAIL mpi: cannot make the nodes (root and iproute2 needed)"; exit 1; }
nodes_sshd || { echo "FAIL mpi: sshd in the nodes"; exit 1; }
nodes_slurm || { echo "FAIL mpi: Slurm in the nodes"; exit 1; }
n1=$(nodes_address 1) n2=$(nodes_address 2)

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI on the nodes' network alone, its ssh the nodes' (trusting only their host key).
export OMPI_MCA_plm_rsh_agent=$NODES_SSH
export OMPI_MCA_btl_tcp_if_include=10.$NODES_SUBNET.0.0/24 OMPI_MCA_oob_tcp_if_include=10.$NODES_SUBNET.0.0/24
mpirun=(timeout 120 mpirun --oversubscribe)
cd "$NODES_DIR" # a working directory every node sees

# ---- host ranks ----
over_ssh() {
    "${mpirun[@]}" --host "$n1,$n2" -n 2 "$bin/pingpong" 65536 100 && says "data verified" &&
        "${mpirun[@]}" --host "$n1,$n2" -n 2 hostname | sort | tr '\n' ' ' | grep -q "^n1 n2 $" &&
        "${mpirun[@]}" --host "$n1:2,$n2:2" -n 4 "$bin/mpicg" 24 24 24 && says "solution verified"
}
check "host ranks, mpirun over ssh into 2 nodes: ping-pong, mpicg on 4 ranks" over_ssh

under_slurm() {
    timeout 120 srun -N 2 -n 2 --mpi=pmix "$bin/pingpong" 65536 100 && says "data verified" &&
        timeout 120 srun -N 2 -n 4 --mpi=pmix "$bin/mpicg" 24 24 24 && says "solution verified"
}
check "host ranks, srun -N 2 --mpi=pmix: ping-pong, mpicg on 4 ranks" under_slurm

host_crash() {
    ! "${mpirun[@]}" --host "$n1,$n2" -n 2 "$bin/allreduce" 4096 10 1 && says "exited on signal 11"
}
check "host ranks: a rank that crashes ends the job (mpirun: exited on signal 11)" host_crash

# Enclave ranks' stdout is no terminal (fully buffered), and a rank can hang in MPI_Finalize
# (docs/mpi.md): the bench then ends it at its limit, so the programs print their results out
# before MPI_Finalize. finalize_exits.so buffers stdout so and ends the rank in MPI_Finalize.
results_before_finalize() {
    local exits=(-x LD_PRELOAD="$bin/finalize_exits.so")
    "${mpirun[@]}" "${exits[@]}" -n 2 "$bin/pingpong" 4096 10
    "${mpirun[@]}" "${exits[@]}" -n 2 "$bin/allreduce" 4096 10
    "${mpirun[@]}" "${exits[@]}" -n 2 "$bin/mpicg" 24 24 24
    says "data verified" && says "results verified" && says "solution verified"
}
check "host ranks: results are out before MPI_Finalize (a rank that never leaves it keeps them)" results_before_finalize

# ---- enclave ranks ----
# Node 1 has enclaves a and b, node 2 an enclave a; each node's clowder finds its own daemon.
for k in 1 2; do nodes_clowderd "$k" || { echo "FAIL mpi: node $k's clowderd did not start"; exit 1; }; done
in_node() { nodes_exec "$@"; }
create() { in_node "$1" "$clowder" enclave create --name "$2" --cores 1 --mem 1G >>"$out" 2>&1; }
: >"$out"
if ! { create 1 a && create 2 a; }; then
    echo "FAILED  enclaves for the MPI ranks cannot be made:"
    sed 's/^/    /' "$out" | tail -5
    exit 1
fi
# A second enclave in node 1 needs a second core that node's clowderd may use: another daemon
# with --isolate-cores can have moved this script's processes off it.
why_no_b=
: >"$out"
create 1 b || why_no_b="node 1 has no second enclave: $(tail -1 "$out")"
probe=$(in_node 1 "$clowder" run --enclave a "$root/build/apps/mpi/sockets" 2>&1)
why_blocked=
[ $? = 0 ] || why_blocked="an LWK job lacks the sockets or interfaces a rank needs (issue 25 point 1; in the enclave: $probe)"

CLOWDER=$clowder
enclave_case() { # [--needs-b] description command...
    local why=$why_blocked
    if [ "$1" = --needs-b ]; then
        why=${why:-$why_no_b}
        shift
    fi
    mpi_case "$why" "$@"
}
# Enclave ranks talk TCP: PMIx's store and Open MPI's transports without shared files. The
# nodes' interface is named (its IPv4 and IPv6 addresses both; before the LWK had netlink and
# the interface ioctls, enclave ranks listed interfaces from /proc/net/if_inet6 alone).
export PMIX_MCA_gds=hash
tcp=(--mca btl tcp,self --mca pml ob1 --mca btl_tcp_if_include "$NODES_INTERFACE")
run_a=("$clowder" run --enclave a)

mpmd() {
    in_node 1 "${mpirun[@]}" "${tcp[@]}" -n 1 "${run_a[@]}" "$bin/pingpong" 65536 10 : \
        -n 1 "$clowder" run --enclave b "$bin/pingpong" 65536 10 && says "data verified"
}
enclave_case --needs-b "mpirun -n 1 clowder run --enclave a : -n 1 clowder run --enclave b (ping-pong)" mpmd

mixed() {
    in_node 1 "${mpirun[@]}" "${tcp[@]}" -n 1 "$bin/mpicg" 24 24 24 : -n 1 "${run_a[@]}" "$bin/mpicg" 24 24 24 &&
        says "solution verified"
}
enclave_case "a host rank beside an enclave rank (mpicg)" mixed

# Open MPI's shared-memory transport between a host rank and an enclave rank: each rank's
# segment is a /dev/shm file the other maps MAP_SHARED (in the enclave, the host file's own
# pages), made by Open MPI's default shmem component (mmap, which asks statfs where the file
# lies); no single-copy mechanism (CMA and XPMEM would need the kernels' help).
vader=(--mca btl vader,self --mca pml ob1 --mca btl_vader_single_copy_mechanism none)
vader_mixed() {
    in_node 1 "${mpirun[@]}" "${vader[@]}" -n 1 "$bin/pingpong" 65536 10 : -n 1 "${run_a[@]}" "$bin/pingpong" 65536 10 &&
        says "data verified" &&
        in_node 1 "${mpirun[@]}" "${vader[@]}" -n 1 "$bin/mpicg" 24 24 24 : -n 1 "${run_a[@]}" "$bin/mpicg" 24 24 24 &&
        says "solution verified"
}
enclave_case "vader (shared memory) between a host rank and an enclave rank (ping-pong, mpicg)" vader_mixed

# The same between enclaves a and b. It hung while both ranks were pid 1 (each LWK numbered its
# processes from 1, and Open MPI takes a segment whose creator has the caller's pid for the
# caller's own); a job's first process now has its clowder run's host pid (docs/mpi.md). 34 s
# and 102 s by hand at load 4-6 on 2026-11-29, so a limit of its own.
vader_a_b() {
    local ab=(-n 1 "${run_a[@]}" "$bin/$1" "${@:2}" : -n 1 "$clowder" run --enclave b "$bin/$1" "${@:2}")
    in_node 1 timeout 300 mpirun --oversubscribe "${vader[@]}" "${ab[@]}"
}
vader_a_b_cases() {
    vader_a_b pingpong 65536 10 && says "data verified" && vader_a_b mpicg 24 24 24 && says "solution verified"
}
enclave_case --needs-b "vader between enclaves a and b (ping-pong, mpicg)" vader_a_b_cases

# Two ranks in one enclave (two jobs of its one vCPU) over vader: their segments are /dev/shm
# files both jobs map MAP_SHARED. 80 s at load 10 (the ranks spin in turn on the one vCPU), so
# a limit of its own.
two_in_one() {
    in_node 1 timeout 300 mpirun --oversubscribe "${vader[@]}" -n 2 "${run_a[@]}" --heap 192M "$bin/allreduce" 65536 10 &&
        says "results verified"
}
enclave_case "mpirun -n 2 clowder run --enclave a (Allreduce over vader)" two_in_one

across_ssh() {
    "${mpirun[@]}" "${tcp[@]}" --host "$n1,$n2" -n 2 "${run_a[@]}" "$bin/mpicg" 24 24 24 && says "solution verified"
}
enclave_case "mpirun over ssh, a rank in each node's enclave a (mpicg)" across_ssh

across_slurm() {
    timeout 120 srun -N 2 -n 2 --mpi=pmix "${run_a[@]}" "$bin/mpicg" 24 24 24 && says "solution verified"
}
enclave_case "srun -N 2, a rank in each node's enclave a (mpicg)" across_slurm

enclave_crash() {
    ! in_node 1 "${mpirun[@]}" "${tcp[@]}" -n 1 "${run_a[@]}" "$bin/allreduce" 4096 10 1 : \
        -n 1 "$clowder" run --enclave b "$bin/allreduce" 4096 10 1 && says "exited on signal 11" &&
        nodes_wait_for 30 nodes_enclaves_idle && mpmd
}
enclave_case --needs-b "an enclave rank that crashes ends the job (exited on signal 11); the enclave runs the next" enclave_crash

# Issue 25 point 4, the user-level data path between enclaves: Open MPI's UCX PML over UCX's
# xpmem transport on libxpmem (its LWK backend), with the project's UCX build first on the
# ranks' loader path (xemem/ucx/build.sh, cached; Debian's UCX has no xpmem transport). UCX_TLS
# names no tcp, so ranks that cannot reach each other through xpmem fail to connect rather than
# fall back; the control run without xpmem must fail so.
ucx=(--mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any --mca btl self -x UCX_TLS -x LD_LIBRARY_PATH)
ucx_pair() { # UCX_TLS: ping-pong 1 B..4 MiB between enclaves a and b
    # Set here and exported by name: mpirun -x NAME=VALUE splits lists at commas, and clowder
    # run --env NAME reads clowder run's own environment.
    UCX_TLS=$1 LD_LIBRARY_PATH="$root/build/ucx/install/lib:$root/xemem/build/lib" \
        in_node 1 timeout 120 mpirun --oversubscribe "${ucx[@]}" \
        -n 1 "${run_a[@]}" --env LD_LIBRARY_PATH "$bin/pingpong" 4194304 20 : \
        -n 1 "$clowder" run --enclave b --env LD_LIBRARY_PATH "$bin/pingpong" 4194304 20
}
# The run must end by itself (MPI_Finalize returning in both ranks, status 0): Open MPI's UCX
# fence spins in ucp_worker_progress after xpmem calls while PMIx's progress thread waits for
# the enclave's one CPU, which hung until the LWK took a tick that came during a host wait.
ucx_xpmem() {
    "$root/xemem/ucx/build.sh" || return 1
    ucx_pair self,xpmem && says "pingpong: 4194304 bytes" && says "data verified" &&
        nodes_wait_for 30 nodes_enclaves_idle && ! ucx_pair self && says "unreachable\|ucp_ep_create"
}
enclave_case --needs-b "UCX over XEMEM between enclaves a and b (ping-pong 1 B..4 MiB, MPI_Finalize returns; fails without xpmem)" ucx_xpmem
# One-sided communication over the same path (issue 25 point 4: RMA into registered memory):
# MPI_Win_allocate, MPI_Put and MPI_Get between fences, through Open MPI's osc/ucx (named, so a
# missing UCX RMA path fails rather than falls back to another component).
ucx_rma() {
    "$root/xemem/ucx/build.sh" || return 1
    UCX_TLS=self,xpmem LD_LIBRARY_PATH="$root/build/ucx/install/lib:$root/xemem/build/lib" \
        in_node 1 timeout 180 mpirun --oversubscribe "${ucx[@]}" --mca osc ucx \
        -n 1 "${run_a[@]}" --env LD_LIBRARY_PATH "$bin/rma" 1048576 20 : \
        -n 1 "$clowder" run --enclave b --env LD_LIBRARY_PATH "$bin/rma" 1048576 20 && says "puts and gets verified"
}
enclave_case --needs-b "UCX over XEMEM between enclaves a and b: one-sided puts and gets (MPI_Win, osc/ucx)" ucx_rma

# UCX's tcp transport (issue 25 point 5): enclave ranks list the node's interfaces (getifaddrs
# over NETLINK_ROUTE, the SIOCGIF* ioctls) and find them in their node's /sys/class/net
# (scripts/nodes.sh). UCX_LOG_LEVEL=info prints the transport each endpoint took.
ucx_tcp=(env UCX_TLS=self,tcp UCX_LOG_LEVEL=info LD_LIBRARY_PATH="$root/build/ucx/install/lib:$root/xemem/build/lib"
    timeout 180 mpirun --oversubscribe "${ucx[@]}" -x UCX_LOG_LEVEL)
ucx_tcp_took() { says "tag($1" && says "pingpong: 65536 bytes" && says "data verified"; } # TRANSPORT/DEVICE
ucx_tcp_pair() {
    "$root/xemem/ucx/build.sh" || return 1
    in_node 1 "${ucx_tcp[@]}" -n 1 "${run_a[@]}" --env LD_LIBRARY_PATH "$bin/pingpong" 65536 10 : \
        -n 1 "$clowder" run --enclave b --env LD_LIBRARY_PATH "$bin/pingpong" 65536 10 && ucx_tcp_took tcp/
}
enclave_case --needs-b "UCX's tcp transport between enclaves a and b (ping-pong 1 B..64 KiB)" ucx_tcp_pair
ucx_tcp_nodes() {
    "$root/xemem/ucx/build.sh" || return 1
    "${ucx_tcp[@]}" --bind-to none --host "$n1,$n2" -n 2 "${run_a[@]}" --env LD_LIBRARY_PATH "$bin/pingpong" 65536 10 &&
        ucx_tcp_took "tcp/$NODES_INTERFACE"
}
enclave_case "UCX's tcp transport across two nodes, a rank in each node's enclave a (ping-pong 1 B..64 KiB)" ucx_tcp_nodes

# The same between enclaves on 2 MiB hugepages: their RAM is a hugetlb file, which maps only in
# whole 2 MiB pages, and UCX's first attach is the peer's 12 KiB FIFO (EINVAL until the VMM
# mapped the pages around such a range and gave its guest the range alone). Node 1's a and b
# are made again so (512 MiB each: the pool grows by 512 pages, given back at the end); the
# cases after this one use node 2 alone.
ucx_hugepages() {
    "$root/xemem/ucx/build.sh" || return 1
    nodes_hugepages 512 || return 1
    local e
    for e in a b; do
        in_node 1 "$clowder" enclave rm "$e" && in_node 1 "$clowder" enclave create --name "$e" --cores 1 --mem 512M --hugepages || return 1
    done
    ucx_pair self,xpmem && says "pingpong: 4194304 bytes" && says "data verified"
}
enclave_case --needs-b "UCX over XEMEM between hugepage enclaves a and b (ping-pong 1 B..4 MiB)" ucx_hugepages

# Four ranks in one enclave (issue 25 point 2): four jobs in a two-vCPU enclave over vader,
# each with a heap of its own size. Last, because node 2's enclave a gives its core up for it.
# Four ranks' MPI_Init alone takes minutes here (each rank's hundreds of file and socket calls
# answered by the loaded host), so a limit of its own: 468 s by hand at load 6-13 on
# 2026-11-29, once threads waiting for a file call's answer gave their CPU away.
four_in_one() {
    in_node 2 "$clowder" enclave rm a >>"$out" 2>&1 &&
        in_node 2 "$clowder" enclave create --name four --cores 2 --mem 1G >>"$out" 2>&1 &&
        in_node 2 timeout 900 mpirun --oversubscribe "${vader[@]}" -n 4 "$clowder" run --enclave four --heap 192M \
            "$bin/allreduce" 65536 10 && says "results verified"
}
enclave_case "mpirun -n 4 clowder run --enclave four (a two-vCPU enclave; Allreduce over vader)" four_in_one

if mpi_wanted MPICH; then
    MPI_ONLY= "$root/scripts/mpich-test.sh" || failures=$((failures + 1)) # Debian's MPICH (Hydra) with ranks in enclaves
fi
mpi_summary test-mpi
