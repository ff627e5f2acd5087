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

cat >"$state/c.xml" <<XML
<?xml version="1.0"?>
<adios-config><io name="SimulationOutput"><engine type="Plugin">
<parameter key="PluginName" value="clowder"/>
<parameter key="PluginLibrary" value="$root/build/adios2/build/libclowder_adios2.so"/>
<parameter key="StreamName" value="lwk-writer"/>
</engine></io></adios-config>
XML
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
    echo "FAIL  the C writer API in an LWK enclave (writer $ws, readers $r1 $r2, stream left: $left)"
    for f in w r1 r2; do sed 's/^/      /' "$state/$f" | tail -4; done
    exit 1
fi

# ADIOS2's C++ reader (the wheel's libraries, found through cxx_reader's RUNPATH by the host's
# ld.so) as an LWK job, attaching a host writer's segments through clowderd.
cat >"$state/py.xml" <<XML
<?xml version="1.0"?>
<adios-config><io name="SimulationOutput"><engine type="Plugin">
<parameter key="PluginName" value="clowder"/>
<parameter key="PluginLibrary" value="$root/build/adios2/build/libclowder_adios2.so"/>
<parameter key="StreamName" value="host-py"/>
</engine></io></adios-config>
XML
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
    echo "FAIL  ADIOS2's C++ reader in an LWK enclave (writer $ws, reader $r1, stream left: $left)"
    for f in w r1; do sed 's/^/      /' "$state/$f" | tail -4; done
    exit 1
fi

# ADIOS2's own libraries (the wheel's, found through cxx_writer's RUNPATH by the host's ld.so)
# in the LWK: the plugin's buffers are private memory there (no memfd), so MaxStepSize bounds
# what the job maps.
cat >"$state/cxx.xml" <<XML
<?xml version="1.0"?>
<adios-config><io name="SimulationOutput"><engine type="Plugin">
<parameter key="PluginName" value="clowder"/>
<parameter key="PluginLibrary" value="$root/build/adios2/build/libclowder_adios2.so"/>
<parameter key="StreamName" value="lwk-cxx"/>
<parameter key="MaxStepSize" value="16777216"/>
<parameter key="RendezvousReaderCount" value="2"/>
</engine></io></adios-config>
XML
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
    echo "FAIL  ADIOS2's C++ writer in an LWK enclave (writer $ws, readers $r1 $r2, stream left: $left)"
    for f in w r1 r2; do sed 's/^/      /' "$state/$f" | tail -4; done
    exit 1
fi
