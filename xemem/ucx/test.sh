#!/usr/bin/env bash
# UCX's xpmem transport against clowder's libxpmem, unmodified: ucx_perftest between two host
# processes with only xpmem able to carry the bytes (UCT tests name the xpmem transport;
# UCP tests run with UCX_TLS=xpmem,self), plus negative controls showing the same runs fail
# when the xpmem component or the broker is absent, and a run under clowderd whose
# `clowder xemem ls` lists UCX's segments.
#
# Builds UCX first if build/ucx has no cached build (xemem/ucx/build.sh; 2.5-6 minutes
# on two cores). Prints "N passed, N failed"; exits non-zero if anything failed.
#
#   XEMEM_LIB_DIR=DIR   use the libxpmem.so.0 in DIR instead of xemem/build/lib
#   UCX_TEST_QUICK=1    fewer iterations
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

"$here/build.sh" || { echo "UCX build failed"; echo "0 passed, 1 failed"; exit 1; }
(cd "$repo" && cargo build -q -p xemem-host --bin xemem-broker -p clowderd --bin clowderd -p clowder-cli --bin clowder) \
    || { echo "cargo build failed"; echo "0 passed, 1 failed"; exit 1; }
target=$(cd "$repo" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
ucx=$repo/build/ucx/install
perftest=$ucx/bin/ucx_perftest
# UCX's xpmem module links libxpmem.so.0 by soname, as it would the system's XPMEM library;
# our build is found through the loader path, nothing in UCX points at it.
export LD_LIBRARY_PATH=${XEMEM_LIB_DIR:-$repo/xemem/build/lib}
if [ "${UCX_TEST_QUICK:-0}" = 1 ]; then lat_iters=2000 bw_iters=200; else lat_iters=20000 bw_iters=2000; fi

scratch=$(mktemp -d)
chmod 0755 "$scratch"
export CLOWDER_XEMEM_SOCKET=$scratch/xemem.sock
"$target/debug/xemem-broker" 2>"$scratch/broker.log" &
broker_pid=$!
daemon_pid=
trap 'kill $broker_pid $daemon_pid 2>/dev/null; wait 2>/dev/null; rm -rf "$scratch"' EXIT
for _ in $(seq 100); do [ -S "$CLOWDER_XEMEM_SOCKET" ] && break; sleep 0.05; done

passed=0
failed=0
summary=()
report() { # name status log
    if [ "$2" -eq 0 ]; then
        passed=$((passed + 1)); echo "ok    $1"
    else
        failed=$((failed + 1)); echo "FAIL  $1 (status $2)"; sed 's/^/      /' "$3" | tail -8
    fi
}

wait_for_port() {
    for _ in $(seq 200); do
        ss -ltn "sport = :$1" | grep -q LISTEN && return 0
        sleep 0.05
    done
    return 1
}

# perftest_pair LOG ARGS...: a server and a client process (the client connects over TCP for
# the out-of-band address exchange only). Status 0 when both exit 0 and a Final line appears.
perftest_pair() {
    local log=$1; shift
    local port=$((20000 + RANDOM % 30000))
    timeout 120 "$perftest" -p "$port" "$@" >"$log.server" 2>&1 &
    local server=$!
    if ! wait_for_port "$port"; then
        kill "$server" 2>/dev/null; wait "$server" 2>/dev/null
        echo "the server never listened on $port" >"$log"; cat "$log.server" >>"$log"; return 1
    fi
    timeout 120 "$perftest" localhost -p "$port" "$@" >"$log" 2>&1
    local client_status=$?
    # A failed client leaves the server waiting for data that never comes.
    [ "$client_status" -eq 0 ] || kill "$server" 2>/dev/null
    wait "$server"
    local server_status=$?
    echo "--- server" >>"$log"; cat "$log.server" >>"$log"
    [ "$client_status" -eq 0 ] && [ "$server_status" -eq 0 ] && grep -q '^Final:' "$log"
}

# measured NAME ARGS...: a passing perftest pair whose Final line goes into the summary.
measured() {
    local name=$1; shift
    perftest_pair "$scratch/$name.log" "$@"
    local status=$?
    report "$name" $status "$scratch/$name.log"
    if [ $status -eq 0 ]; then
        summary+=("$(printf '%-26s %s' "$name" "$(grep '^Final:' "$scratch/$name.log" | tr -s ' ')")")
    fi
}

# --- the transport is there, and is ours -------------------------------------------------
{
    ldd "$ucx/lib/ucx/libuct_xpmem.so" | grep "libxpmem.so.0 => $LD_LIBRARY_PATH/libxpmem.so.0" &&
    "$ucx/bin/ucx_info" -d | tee "$scratch/info" | grep -q 'Transport: xpmem' &&
    grep -q 'Component: xpmem' "$scratch/info"
} >"$scratch/info.log" 2>&1
report "ucx_info lists the xpmem transport over our libxpmem" $? "$scratch/info.log"

# --- UCT: the xpmem transport alone (-x xpmem), nothing else in the process is used ---------
uct=(-d memory -x xpmem)
measured uct_put_lat_8B "${uct[@]}" -t put_lat -s 8 -n $lat_iters -w 1000
measured uct_am_lat_8B "${uct[@]}" -t am_lat -s 8 -n $lat_iters -w 1000
measured uct_put_bw_64KiB "${uct[@]}" -t put_bw -s 65536 -n $bw_iters -w 100
measured uct_put_bw_1MiB "${uct[@]}" -t put_bw -s 1048576 -n $bw_iters -w 100
# xpmem has no get_zcopy: get_bcopy copies from the attached peer memory.
measured uct_get_bw_1MiB "${uct[@]}" -t get -D bcopy -s 1048576 -n $bw_iters -w 100

# --- UCP: UCX_TLS=xpmem,self, so xpmem is the only transport between the two processes -----
export UCX_TLS=xpmem,self
measured ucp_tag_lat_8B -t tag_lat -s 8 -n $lat_iters -w 1000
measured ucp_tag_bw_64KiB -t tag_bw -s 65536 -n $bw_iters -w 100
measured ucp_tag_bw_1MiB -t tag_bw -s 1048576 -n $bw_iters -w 100
measured ucp_put_bw_1MiB -t ucp_put_bw -s 1048576 -n $bw_iters -w 100
measured ucp_get_bw_1MiB -t ucp_get -s 1048576 -n $bw_iters -w 100

# --- negative controls: without the component, or without a broker, the same runs fail ------
(
    export UCX_MODULES=^xpmem
    ! "$ucx/bin/ucx_info" -d | grep -q 'Transport: xpmem' &&
    ! perftest_pair "$scratch/no-component.pair" -t tag_lat -s 8 -n 100 -w 10 &&
    ! perftest_pair "$scratch/no-component.uct" "${uct[@]}" -t put_lat -s 8 -n 100 -w 10
) >"$scratch/no-component.log" 2>&1
report "without the xpmem component (UCX_MODULES=^xpmem) the runs fail" $? "$scratch/no-component.log"
(
    # xpmem_version() answers -1 with no broker, so UCX disables the transport, as it does
    # without /dev/xpmem.
    export CLOWDER_XEMEM_SOCKET=$scratch/nobody-listens.sock
    ! "$ucx/bin/ucx_info" -d | grep -q 'Transport: xpmem' &&
    ! perftest_pair "$scratch/no-broker.pair" -t tag_lat -s 8 -n 100 -w 10
) >"$scratch/no-broker.log" 2>&1
report "without a broker the xpmem transport is absent and the runs fail" $? "$scratch/no-broker.log"

# --- under clowderd: the daemon's broker serves UCX, `clowder xemem ls` shows its segments ---
(
    export CLOWDER_SOCKET=$scratch/daemon/clowderd.sock
    unset CLOWDER_XEMEM_SOCKET
    mkdir -p "$scratch/daemon"
    # Nothing boots: any existing file stands in for the LWK image.
    "$target/debug/clowderd" --kernel "$target/debug/clowderd" 2>"$scratch/daemon.log" &
    echo $! >"$scratch/daemon.pid"
    for _ in $(seq 200); do [ -S "$scratch/daemon/xemem.sock" ] && break; sleep 0.05; done
    # A run of a few seconds in the background; while it runs, each process's whole-address-
    # space segment (UCX makes one per process) is listed.
    perftest_pair "$scratch/daemon.pair" -t tag_bw -s 1048576 -n $((bw_iters * 3)) -w 10 &
    pair=$!
    listed=0
    for _ in $(seq 400); do
        "$target/debug/clowder" xemem ls >"$scratch/table"
        if [ "$(grep -c '^0x.* host ' "$scratch/table")" -ge 2 ]; then listed=1; cat "$scratch/table"; break; fi
        sleep 0.02
    done
    wait $pair || { echo "the perftest pair under clowderd failed"; cat "$scratch/daemon.pair"; exit 1; }
    [ $listed = 1 ] || echo "clowder xemem ls never listed two segments"
    [ $listed = 1 ]
) >"$scratch/daemon.case.log" 2>&1
status=$?
daemon_pid=$(cat "$scratch/daemon.pid" 2>/dev/null)
[ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
report "under clowderd, clowder xemem ls lists UCX's segments during a run" $status "$scratch/daemon.case.log"
[ $status -eq 0 ] && sed -n '/^SEGID/,$p' "$scratch/daemon.case.log" | sed 's/^/      /'

echo
echo "perftest Final lines: iterations, latency or overhead us (50%ile, average, overall),"
echo "bandwidth MB/s (average, overall), message rate /s (average, overall):"
for line in "${summary[@]}"; do echo "  $line"; done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
