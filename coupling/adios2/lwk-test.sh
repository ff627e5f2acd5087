#!/usr/bin/env bash
# ADIOS2 streams between an LWK enclave and the host: a static c_writer job (the C writer API,
# no ADIOS2) and then ADIOS2's own C++ writer (cxx_writer: a dynamically linked job on the
# wheel's libraries, loaded by the host's ld.so) each publish 3 steps through the LWK's
# /dev/xpmem, read on the host by ADIOS2's Python and C++ readers through clowderd's broker;
# and ADIOS2's C++ reader (cxx_reader, a selection) as an LWK job reads a host Python
# writer's 3 steps. Every value is checked, and no stream is left behind. Needs /dev/kvm and
# root; run by coupling/adios2/test.sh. Prints "ok"/"FAIL" lines; exit 1 on a failure.
set -u
cd "$(dirname "$0")/../.."
root=$(pwd)
bin=$root/target/release
if [ ! -e /dev/kvm ]; then
    echo "skip  ADIOS2 in an LWK enclave: /dev/kvm is absent"
    exit 0
fi
for b in clowderd clowder clowder-vmm; do
    [ -x "$bin/$b" ] || { echo "FAIL  ADIOS2 in an LWK enclave: $bin/$b is not built (make build)"; exit 1; }
done
scripts/adios2-setup.sh || exit 1

state=$(mktemp -d)
chmod 0755 "$state"
export CLOWDER_SOCKET=$state/clowderd.sock CLOWDER_XEMEM_SOCKET=$state/xemem.sock
export PYTHONPATH=$root/build/adios2/py
"$bin/clowderd" --vmm "$bin/clowder-vmm" --socket "$CLOWDER_SOCKET" --xemem-socket "$CLOWDER_XEMEM_SOCKET" \
    --ping-timeout 120000 >"$state/clowderd.log" 2>&1 &
daemon=$!
cleanup() {
    "$bin/clowder" enclave rm adios2-test >/dev/null 2>&1
    kill $daemon 2>/dev/null
    wait $daemon 2>/dev/null
    rm -rf "$state"
}
trap cleanup EXIT
for _ in $(seq 200); do [ -S "$CLOWDER_SOCKET" ] && [ -S "$CLOWDER_XEMEM_SOCKET" ] && break; sleep 0.05; done
# A core another test's daemon holds comes free within a minute.
for _ in $(seq 30); do
    "$bin/clowder" enclave create --name adios2-test --cores 1 --mem 512M >"$state/create.out" 2>&1 && break
    grep -q "not online or not allowed\|no free core" "$state/create.out" || break
    sleep 2
done
if ! grep -q "created enclave" "$state/create.out"; then
    echo "FAIL  ADIOS2 in an LWK enclave: no enclave"; sed 's/^/      /' "$state/create.out" | tail -3
    exit 1
fi

# The segid of STREAM's control segment at the broker, -1 once the writer removed it.
segid_of() {
    python3 -c "
import ctypes
lib = ctypes.CDLL('$root/xemem/build/lib/libxpmem.so.0')
lib.xemem_lookup_segid.restype = ctypes.c_int64
print(lib.xemem_lookup_segid(b'adios2:$1'))"
}

# Writes to FILE an ADIOS2 configuration selecting the clowder plugin engine for STREAM, with
# any further KEY=VALUE engine parameters.
plugin_xml() {
    local file=$1 stream=$2 pair
    shift 2
    {
        echo '<?xml version="1.0"?>'
        echo '<adios-config><io name="SimulationOutput"><engine type="Plugin">'
        echo '<parameter key="PluginName" value="clowder"/>'
        echo "<parameter key=\"PluginLibrary\" value=\"$root/build/adios2/build/libclowder_adios2.so\"/>"
        echo "<parameter key=\"StreamName\" value=\"$stream\"/>"
        for pair in "$@"; do echo "<parameter key=\"${pair%%=*}\" value=\"${pair#*=}\"/>"; done
        echo '</engine></io></adios-config>'
    } >"$file"
}

# Says FAIL with MESSAGE and the last lines of each output named (w, r1, r2), and stops.
fail() {
    local message=$1 f
    shift
    echo "FAIL  $message"
    for f in "$@"; do sed 's/^/      /' "$state/$f" | tail -4; done
    exit 1
}

plugin_xml "$state/c.xml" lwk-writer
timeout 120 "$bin/clowder" run adios2-test "$root/build/adios2/build/c_writer_static" lwk-writer 3 32 16 \
    RendezvousReaderCount=2,MaxStepSize=16777216 >"$state/w" 2>&1 &
w=$!
timeout 120 python3 "$root/coupling/adios2/tests/py_reader.py" "$state/c.xml" x >"$state/r1" 2>&1 &
r1=$!
timeout 120 "$root/build/adios2/build/cxx_reader" "$state/c.xml" x 4 2 20 10 >"$state/r2" 2>&1
r2=$?
wait $r1; r1=$?
wait $w; ws=$?
left=$(segid_of lwk-writer)
if [ $ws = 0 ] && [ $r1 = 0 ] && [ $r2 = 0 ] && grep -q "after 3 steps" "$state/r1" &&
    grep -q "after 3 steps" "$state/r2" && [ "$left" = -1 ]; then
    echo "ok    the C writer API in an LWK enclave (static, /dev/xpmem), ADIOS2 Python and C++ readers on the host"
else
    fail "the C writer API in an LWK enclave (writer $ws, readers $r1 $r2, stream left: $left)" w r1 r2
fi

# ADIOS2's C++ reader (the wheel's libraries, found through cxx_reader's RUNPATH by the host's
# ld.so) as an LWK job, attaching a host writer's segments through clowderd.
plugin_xml "$state/py.xml" host-py
timeout 120 python3 "$root/coupling/adios2/tests/py_writer.py" "$state/py.xml" x 3 64 48 >"$state/w" 2>&1 &
w=$!
timeout 120 "$bin/clowder" run adios2-test "$root/build/adios2/build/cxx_reader" "$state/py.xml" x 10 5 40 30 \
    >"$state/r1" 2>&1
r1=$?
wait $w; ws=$?
left=$(segid_of host-py)
if [ $ws = 0 ] && [ $r1 = 0 ] && grep -q "after 3 steps" "$state/r1" && grep -q "^step 2 ok .* sel 10+40,5+30" "$state/r1" &&
    [ "$left" = -1 ]; then
    echo "ok    ADIOS2's Python writer on the host, its C++ reader (the wheel's libraries) in an LWK enclave"
else
    fail "ADIOS2's C++ reader in an LWK enclave (writer $ws, reader $r1, stream left: $left)" w r1
fi

# ADIOS2's own libraries (the wheel's, found through cxx_writer's RUNPATH by the host's ld.so)
# in the LWK: the plugin's buffers are private memory there (no memfd), so MaxStepSize bounds
# what the job maps.
plugin_xml "$state/cxx.xml" lwk-cxx MaxStepSize=16777216 RendezvousReaderCount=2
timeout 120 "$bin/clowder" run adios2-test "$root/build/adios2/build/cxx_writer" "$state/cxx.xml" x 3 64 48 \
    >"$state/w" 2>&1 &
w=$!
timeout 120 python3 "$root/coupling/adios2/tests/py_reader.py" "$state/cxx.xml" x >"$state/r1" 2>&1 &
r1=$!
timeout 120 "$root/build/adios2/build/cxx_reader" "$state/cxx.xml" x 10 5 40 30 >"$state/r2" 2>&1
r2=$?
wait $r1; r1=$?
wait $w; ws=$?
left=$(segid_of lwk-cxx)
if [ $ws = 0 ] && [ $r1 = 0 ] && [ $r2 = 0 ] && grep -q "after 3 steps" "$state/r1" &&
    grep -q "after 3 steps" "$state/r2" && grep -q "sel 10+40,5+30" "$state/r2" && [ "$left" = -1 ]; then
    echo "ok    ADIOS2's C++ writer (the wheel's libraries) in an LWK enclave, ADIOS2 Python and C++ readers on the host"
else
    fail "ADIOS2's C++ writer in an LWK enclave (writer $ws, readers $r1 $r2, stream left: $left)" w r1 r2
fi
