# The case runner of scripts/mpi-test.sh and scripts/mpich-test.sh (sourced, after
# scripts/nodes.sh; $out names the file each case's output goes to):
#   mpi_case WHY DESCRIPTION COMMAND...   runs COMMAND, its output in $out, once the nodes'
#                                         enclaves are idle; a non-empty WHY says BLOCKED (and
#                                         why) instead; ok or FAILED with the output's tail
#   says TEXT                             whether the last case's output has TEXT
#   mpi_summary NAME                      "NAME: N passed, N failed, N blocked"; whether none failed
# MPI_ONLY=TEXT runs only the cases whose description contains TEXT.
failures=0 passed=0 blocked=0

mpi_wanted() { [[ -z ${MPI_ONLY:-} || $1 == *"$MPI_ONLY"* ]]; }
says() { grep -q -- "$1" "$out"; }

mpi_case() { # WHY DESCRIPTION COMMAND...
    local why=$1 what=$2
    shift 2
    mpi_wanted "$what" || return 0
    if [ -n "$why" ]; then
        blocked=$((blocked + 1))
        echo "BLOCKED $what: $why"
        return
    fi
    # The job of a case that failed ends when its clowder run is killed, which takes the LWK a
    # moment.
    nodes_wait_for 30 nodes_enclaves_idle || echo "note: the enclaves still run an earlier job after 30 s"
    : >"$out"
    if "$@" >>"$out" 2>&1; then
        passed=$((passed + 1)) && echo "ok      $what"
    else
        failures=$((failures + 1)) && echo "FAILED  $what" && sed 's/^/    /' "$out" | tail -15
    fi
}

mpi_summary() { # NAME
    echo "$1: $passed passed, $failures failed, $blocked blocked"
    [ $failures = 0 ]
}
