#!/usr/bin/env bash
# XEMEM conformance suite between host processes: builds libxpmem (shared and static), the
# standalone segment broker and the conformance program, starts a private broker, and runs
# every case twice (program linked against libxpmem.so.0, and statically against libxpmem.a),
# and the shared build's once more on the text of /proc/self/maps (CLOWDER_XEMEM_MAPS=text),
# the snapshot cases (tests/snapshot.c), the Linux-VM backend against a fake PCI device
# (tests/pci_fake.c), the Python package's tests (python/test.sh),
# plus the broker's robustness against malformed packets and libxpmem's CLOWDER_LOG levels.
# Prints "N passed, N failed" and exits non-zero if anything failed. Root is needed for the
# permission matrix (setuid).
set -u
cd "$(dirname "$0")"
here=$(pwd)

make -s all >/dev/null && make -s -C tests all >/dev/null || { echo "build failed"; exit 1; }
(cd .. && cargo build -q -p xemem-host --bin xemem-broker) || { echo "broker build failed"; exit 1; }
target=$(cd .. && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
broker=$target/debug/xemem-broker

scratch=$(mktemp -d)
chmod 0755 "$scratch" # unprivileged test processes must reach the socket
export CLOWDER_XEMEM_SOCKET=$scratch/xemem.sock
"$broker" 2>"$scratch/broker.log" &
broker_pid=$!
trap 'kill $broker_pid 2>/dev/null; wait $broker_pid 2>/dev/null; rm -rf "$scratch"' EXIT
for _ in $(seq 100); do [ -S "$CLOWDER_XEMEM_SOCKET" ] && break; sleep 0.05; done

passed=0
failed=0
report() { # name status log
    if [ "$2" -eq 0 ]; then
        passed=$((passed + 1)); echo "ok    $1"
    else
        failed=$((failed + 1)); echo "FAIL  $1 (status $2)"; sed 's/^/      /' "$3" | tail -5
    fi
}

for program in conformance conformance-static; do
    for name in $("$here/build/tests/$program" --list); do
        timeout 300 "$here/build/tests/$program" "$name" >"$scratch/log" 2>&1
        report "$program $name" $? "$scratch/log"
    done
done
# Once more reading the text of /proc/self/maps, as on kernels without PROCMAP_QUERY.
for name in $("$here/build/tests/conformance" --list); do
    CLOWDER_XEMEM_MAPS=text timeout 300 "$here/build/tests/conformance" "$name" >"$scratch/log" 2>&1
    report "conformance-maps-text $name" $? "$scratch/log"
done

# Snapshots (TCASM), finding the written pages by userfaultfd's write-protect (tracked), and the
# writer's copies by PAGEMAP_SCAN and by reading /proc/self/pagemap (the fallbacks).
for name in $("$here/build/tests/snapshot" --list); do
    for pagemap in tracked scan read; do
        CLOWDER_XEMEM_PAGEMAP=$pagemap timeout 120 "$here/build/tests/snapshot" "$name" >"$scratch/log" 2>&1
        report "snapshot-$pagemap $name" $? "$scratch/log"
    done
done

# The Linux-VM backend (src/backend_pci.c) against a fake XEMEM PCI device: no VM, no broker.
for name in $("$here/build/tests/pci_fake" --list); do
    timeout 60 "$here/build/tests/pci_fake" "$name" >"$scratch/log" 2>&1
    report "pci-fake $name" $? "$scratch/log"
done

# The Python package (python/: clowder.xemem, snapshots included), over this broker.
"$here/../python/test.sh" >"$scratch/log" 2>&1
report "python clowder.xemem (python/test.sh)" $? "$scratch/log"

# CLOWDER_LOG: at debug (or xemem=debug) libxpmem says which broker call failed and why; not at
# the default level, nor when xemem's own level is lower; a value it cannot read is said once.
conformance_stderr() { # CLOWDER_LOG value (unset when "-")
    if [ "$1" = - ]; then
        env -u CLOWDER_LOG -u CLOWDER_XEMEM_DEBUG "$here/build/tests/conformance" id_errors 2>&1 >/dev/null
    else
        env -u CLOWDER_XEMEM_DEBUG CLOWDER_LOG="$1" "$here/build/tests/conformance" id_errors 2>&1 >/dev/null
    fi
}
{
    failure='^libxpmem: broker op 4 failed (No such file or directory)$'
    conformance_stderr debug | grep -q "$failure" || echo "CLOWDER_LOG=debug: the failed remove is not said"
    conformance_stderr warn,xemem=debug | grep -q "$failure" || echo "CLOWDER_LOG=warn,xemem=debug: the failed remove is not said"
    [ -z "$(conformance_stderr -)" ] || echo "CLOWDER_LOG unset: something is said"
    [ -z "$(conformance_stderr DEBUG,xemem=info)" ] || echo "CLOWDER_LOG=DEBUG,xemem=info: something is said"
    [ "$(conformance_stderr info,loud)" = "libxpmem: CLOWDER_LOG takes error, warn, info, debug or trace (or xemem=LEVEL among other directives), not 'info,loud'" ] ||
        echo "CLOWDER_LOG=info,loud: not said once"
} >"$scratch/log" 2>&1
[ ! -s "$scratch/log" ]
report "CLOWDER_LOG levels of libxpmem" $? "$scratch/log"

# The exported ABI (nm -D against src/libxpmem.map), the soname and the pkg-config files.
tests/abi.sh >"$scratch/log" 2>&1
report "abi and pkg-config" $? "$scratch/log"

# The broker answers malformed packets with an error and keeps serving everyone else.
python3 - "$CLOWDER_XEMEM_SOCKET" >"$scratch/log" 2>&1 <<'PY'
import socket, struct, sys
path = sys.argv[1]
def ask(packet):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    s.send(packet)
    answer = s.recv(65536)
    s.close()
    return answer
magic, version = 0x4d4d4558, 1
for bad in [b"", b"x", b"\0" * 63, struct.pack("<IHH", magic, 2, 1) + b"\0" * 56,
            struct.pack("<IHH", magic, version, 99) + b"\0" * 56,
            struct.pack("<IHH", magic, version, 5) + b"\0" * 56 + b"trailing",
            struct.pack("<IHH", magic, version, 9) + b"\0" * 56 + b"x" * 64,
            struct.pack("<IHH", magic, version, 3) + struct.pack("<7Q", 4096, 4096, 0o600, 0, 0, 0, 0)]:
    if not bad:
        continue
    answer = ask(bad)
    _, _, _, errno = struct.unpack("<IHHi", answer[:12])
    assert errno != 0, (bad, answer)
hello = ask(struct.pack("<IHH", magic, version, 1) + b"\0" * 56)
assert struct.unpack("<IHHi", hello[:12])[3] == 0
print("broker answered every malformed packet with an error and still serves")
PY
report "broker malformed packets" $? "$scratch/log"
if ! kill -0 $broker_pid 2>/dev/null; then
    failed=$((failed + 1)); echo "FAIL  broker died"; tail -5 "$scratch/broker.log"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
