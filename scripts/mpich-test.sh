#!/usr/bin/env bash
# The MPICH part of make test-mpi (run at the end of scripts/mpi-test.sh, or alone): Debian's
# MPICH (ch4:ucx, the Hydra launcher mpiexec.mpich) with ranks in LWK enclaves (issue 25 point 3)
#   mpmd   mpiexec.mpich -n 1 clowder run --enclave a ./app : -n 1 clowder run --enclave b ./app
#          (ping-pong, mpicg)
#   mixed  a host rank beside an enclave rank (ping-pong, mpicg)
#          both over UCX's xpmem transport (UCX_TLS=self,xpmem, the project's UCX build)
#   pmi    Hydra's PMI-1 wire-up alone (apps/mpi/pmi_probe.c, static) with ranks in enclaves a and
#          b, and a host rank beside one in a; the MPI cases say BLOCKED (and why) where an
#          MPICH program cannot start alone in an enclave
# Hydra wires ranks up by PMI-1 over an inherited socket (PMI_FD), which clowder run relays to
# the job as a loopback TCP port (PMI_PORT; node/cli/src/launcher.rs says why and how).
# Installs Debian's mpich and libmpich-dev first (they may take over the mpirun/mpicc
# alternatives, so these are set back to Open MPI's; the tests call mpiexec.mpich and
# mpicc.mpich by name). The programs are apps/mpi's, built by mpicc.mpich (dynamically linked:
# Debian's MPICH has no static UCX to link). Needs root and /dev/kvm.
set -uo pipefail
[ $# = 0 ] || { echo "usage: scripts/mpich-test.sh (no arguments)" >&2; exit 2; }
cd "$(dirname "$0")/.."
root=$PWD

# Debian's MPICH beside Open MPI: mpirun and mpicc stay Open MPI's.
if ! command -v mpiexec.mpich >/dev/null || ! command -v mpicc.mpich >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q mpich libmpich-dev >/dev/null ||
        { echo "FAIL mpich: apt-get install mpich libmpich-dev"; exit 1; }
fi
update-alternatives --quiet --set mpirun /usr/bin/mpirun.openmpi &&
    update-alternatives --quiet --set mpi /usr/bin/mpicc.openmpi ||
    { echo "FAIL mpich: cannot set mpirun/mpicc back to Open MPI's"; exit 1; }

. scripts/nodes.sh
trap nodes_down EXIT
trap 'exit 1' INT TERM

make -s -C apps/mpi >/dev/null && [ -x build/apps/mpi/mpich/pingpong ] ||
    { echo "FAIL mpich: apps/mpi does not build with mpicc.mpich"; exit 1; }
bin=$root/build/apps/mpi/mpich
clowder=$root/target/release/clowder
CLOWDERD=$root/target/release/clowderd
CLOWDER=$clowder
out=$NODES_DIR/out
. scripts/lib/mpi-cases.sh

# One node (its own clowderd, /run/clowder and network) with enclaves a and b.
nodes_up 1 || { echo "FAIL mpich: cannot make the node (root and iproute2 needed)"; exit 1; }
nodes_clowderd 1 || { echo "FAIL mpich: the node's clowderd did not start"; exit 1; }
: >"$out"
for name in a b; do
    nodes_exec 1 "$clowder" enclave create --name "$name" --cores 1 --mem 1G >>"$out" 2>&1 ||
        { echo "FAIL mpich: enclave $name cannot be made:"; sed 's/^/    /' "$out" | tail -5; exit 1; }
done
cd "$NODES_DIR"

# MPICH's UCX over UCX's xpmem transport (our libxpmem: the LWK's /dev/xpmem in an enclave, the
# broker on the host), with the project's UCX build first on the ranks' loader path
# (xemem/ucx/build.sh, cached; Debian's UCX has no xpmem). In an LWK job UCX's tcp finds no
# network device and its posix/sysv shared memory fails ("Shared memory error" in MPI_Init).
"$root/xemem/ucx/build.sh" >"$out" 2>&1 || { echo "FAIL mpich: xemem/ucx/build.sh:"; tail -5 "$out"; exit 1; }
export UCX_TLS=self,xpmem LD_LIBRARY_PATH="$root/build/ucx/install/lib:$root/xemem/build/lib"

# A probe: the program alone in the enclave (MPI_Init as a singleton, size 1), to tell a rank
# that cannot start there at all from a failed wire-up.
probe=$(nodes_exec 1 timeout 60 "$clowder" run --enclave a --env LD_LIBRARY_PATH "$bin/pingpong" 2>&1)
why_blocked=
case $probe in
*"needs at least 2 ranks"*) ;;
*) why_blocked="an MPICH program does not start alone in an LWK enclave: $(printf '%s' "$probe" | tail -1)" ;;
esac

mpiexec=(timeout 120 mpiexec.mpich)
run_a=("$clowder" run --enclave a --env LD_LIBRARY_PATH)
run_b=("$clowder" run --enclave b --env LD_LIBRARY_PATH)

case_() { # [--static] description command...: --static cases need no dynamic loader
    local why=$why_blocked
    if [ "$1" = --static ]; then
        why=
        shift
    fi
    mpi_case "$why" "$@"
}

# Hydra's PMI-1 wire-up alone (apps/mpi/pmi_probe.c, static: put, barrier, get across the
# ranks): an enclave rank reaches its proxy only through clowder run's relay.
probe_bin=$root/build/apps/mpi/pmi_probe
pmi_wireup() {
    nodes_exec 1 "${mpiexec[@]}" -n 1 "${run_a[@]}" "$probe_bin" : -n 1 "${run_b[@]}" "$probe_bin" &&
        says "pmi_probe: 2 ranks verified (PMI_PORT)" &&
        nodes_exec 1 "${mpiexec[@]}" -n 1 "$probe_bin" : -n 1 "${run_a[@]}" "$probe_bin" &&
        says "pmi_probe: 2 ranks verified (PMI_FD)"
}
case_ --static "Hydra's PMI-1 wire-up into enclave ranks through clowder run's relay (a:b, and a host rank beside a)" pmi_wireup

mpmd() {
    nodes_exec 1 "${mpiexec[@]}" -n 1 "${run_a[@]}" "$bin/pingpong" 65536 10 : -n 1 "${run_b[@]}" "$bin/pingpong" 65536 10 &&
        says "data verified" &&
        nodes_exec 1 "${mpiexec[@]}" -n 1 "${run_a[@]}" "$bin/mpicg" 24 24 24 : -n 1 "${run_b[@]}" "$bin/mpicg" 24 24 24 &&
        says "solution verified"
}
case_ "mpiexec.mpich -n 1 clowder run --enclave a : -n 1 clowder run --enclave b (ping-pong, mpicg)" mpmd

mixed() {
    nodes_exec 1 "${mpiexec[@]}" -n 1 "$bin/pingpong" 65536 10 : -n 1 "${run_a[@]}" "$bin/pingpong" 65536 10 &&
        says "data verified" &&
        nodes_exec 1 "${mpiexec[@]}" -n 1 "$bin/mpicg" 24 24 24 : -n 1 "${run_a[@]}" "$bin/mpicg" 24 24 24 &&
        says "solution verified"
}
case_ "MPICH: a host rank beside an enclave rank (ping-pong, mpicg)" mixed

mpi_summary test-mpich
