# Sourced by the scripts that need an XEMEM broker of their own (tests, benchmarks, demos):
#   . scripts/private-broker.sh; start_private_broker SCRATCH
# builds the broker (optimised, as clowderd carries it), starts it on SCRATCH/xemem.sock with
# its log in SCRATCH/broker.log, exports CLOWDER_XEMEM_SOCKET and sets broker_pid (the caller's
# EXIT trap stops it: `stop_private_broker`). SCRATCH must be reachable by the processes that
# use the socket (0755 for unprivileged tests).

start_private_broker() { # scratch
    local root target
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    (cd "$root" && cargo build -q --release -p xemem-host --bin xemem-broker) || { echo "xemem-broker build failed" >&2; return 1; }
    target=$(cd "$root" && cargo metadata --format-version 1 --no-deps |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    export CLOWDER_XEMEM_SOCKET=$1/xemem.sock
    "$target/release/xemem-broker" 2>"$1/broker.log" &
    broker_pid=$!
    for _ in $(seq 100); do [ -S "$CLOWDER_XEMEM_SOCKET" ] && return 0; sleep 0.05; done
    echo "the private xemem-broker did not open $CLOWDER_XEMEM_SOCKET: $(tail -3 "$1/broker.log")" >&2
    return 1
}

stop_private_broker() {
    if [ -n "${broker_pid:-}" ]; then
        kill "$broker_pid" 2>/dev/null
        wait "$broker_pid" 2>/dev/null || true
    fi
}
