#!/usr/bin/env bash
# The main demo: the node daemon partitions the machine, creates a lightweight-kernel enclave on
# a dedicated core and runs a CG simulation (apps/hpccg) in it; the same binary then runs on the
# host, on the same core, for comparison. Then scripts/insitu.sh couples a CG simulation in an
# enclave to analytics on the host, through files and through XEMEM, under the same daemon.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -e /dev/kvm ]; then
    echo "demo: /dev/kvm is missing: enclaves need KVM" >&2
    exit 1
fi
make -s -C apps >/dev/null
bin=target/release
app=build/apps/hpccg
grid=(48 48 48)
core=$(( $(nproc) - 1 ))

state=$(mktemp -d /tmp/clowder-demo.XXXXXX)
export CLOWDER_SOCKET="$state/clowderd.sock"
"$bin/clowderd" --vmm "$bin/clowder-vmm" >"$state/clowderd.log" 2>&1 &
daemon=$!
cleanup() {
    kill "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
    rm -rf "$state"
}
trap cleanup EXIT
for _ in $(seq 100); do [ -S "$CLOWDER_SOCKET" ] && break; sleep 0.05; done

echo "== clowderd is up; the node: =="
"$bin/clowder" enclave ls
echo
echo "== clowder enclave create --name sim --kind lwk --cores $core --mem 512M =="
start=$(date +%s%N)
"$bin/clowder" enclave create --name sim --kind lwk --cores "$core" --mem 512M
echo "   created in $(( ($(date +%s%N) - start) / 1000000 )) ms"
"$bin/clowder" enclave ls
echo
echo "== clowder run sim hpccg ${grid[*]}  (the unmodified static binary, output streamed back) =="
"$bin/clowder" run sim "$app" "${grid[@]}"
"$bin/clowder" enclave rm sim
echo
echo "== the same binary on the host, core $core =="
taskset -c "$core" "$app" "${grid[@]}"
echo
echo "== the in-situ composition (XEMEM paper, section 6): the CG simulation in an LWK enclave, =="
echo "== STREAM analytics on the host; beside it both on the host coupled through files        =="
scripts/insitu.sh --config host-files,lwk-host --workflow sync-once,async-once   # the full matrix: make bench-insitu
echo
echo "== coupling through ADIOS2 (our XEMEM engine, PluginName=clowder): a C++ CG writes its =="
echo "== solution vector each interval, Python analytics read it through adios2's bindings =="
scripts/adios2-demo.sh
