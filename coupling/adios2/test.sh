#!/usr/bin/env bash
# The clowder ADIOS2 engine between host processes, through ADIOS2's own C++, C and Python
# APIs, with a private XEMEM broker: a C++ writer and a Python reader (whole array and a
# selection), a Python writer and C++ and C readers, the C writer API (no ADIOS2) and ADIOS2
# readers, zero-copy reading in place (and a reader holding a step), two readers of one
# stream, a reader that joins late, the Discard policy, and bad input (an unknown stream, a wrong type, a selection
# outside the shape, a writer killed mid-step, a hostile writer's malformed segments, malformed
# configurations), none of which may crash the writer or reader or leave a segment behind;
# then lwk-test.sh (the C writer API and ADIOS2's own C++ writer and reader as LWK enclave jobs)
# where /dev/kvm is. Prints "N passed, N failed"; exit 1 on a failure.
set -u
cd "$(dirname "$0")/../.."
root=$(pwd)
scripts/adios2-setup.sh || { echo "adios2 setup failed"; exit 1; }
. scripts/private-broker.sh

bin=$root/build/adios2/build
tests=$root/coupling/adios2/tests
export PYTHONPATH=$root/build/adios2/py
scratch=$(mktemp -d)
chmod 0755 "$scratch"
trap 'stop_private_broker; rm -rf "$scratch"' EXIT
start_private_broker "$scratch" || { echo "broker start failed"; exit 1; }

# config NAME [KEY=VALUE]...: an ADIOS2 XML configuration selecting the clowder plugin. The
# stream is the IO's name ("SimulationOutput") unless StreamName is given (docs/adios2.md).
config() {
    local file=$scratch/$1.xml kv
    shift
    {
        echo '<?xml version="1.0"?>'
        echo '<adios-config><io name="SimulationOutput"><engine type="Plugin">'
        echo '<parameter key="PluginName" value="clowder"/>'
        echo "<parameter key=\"PluginLibrary\" value=\"$bin/libclowder_adios2.so\"/>"
        for kv in "$@"; do echo "<parameter key=\"${kv%%=*}\" value=\"${kv#*=}\"/>"; done
        echo '</engine></io></adios-config>'
    } >"$file"
    echo "$file"
}
# The stream's control segment is gone (xemem_lookup_segid finds no name).
no_segment_left() { # STREAM
    python3 -c "
import ctypes, sys
lib = ctypes.CDLL('$root/xemem/build/lib/libxpmem.so.0')
lib.xemem_lookup_segid.restype = ctypes.c_int64
sys.exit(0 if lib.xemem_lookup_segid(b'adios2:$1') == -1 else 1)"
}

passed=0 failed=0
check() { # NAME CONDITION-STATUS LOG...
    local name=$1 status=$2
    shift 2
    if [ "$status" -eq 0 ]; then
        passed=$((passed + 1)); echo "ok    $name"
    else
        failed=$((failed + 1)); echo "FAIL  $name"
        for log in "$@"; do sed 's/^/      /' "$log" | tail -6; done
    fi
}
run() { timeout 60 "$@"; }
W=$scratch/writer.log R=$scratch/reader.log R2=$scratch/reader2.log

c=$(config s1 StreamName=s1)
run "$bin/cxx_writer" "$c" out.bp 4 64 48 >"$W" 2>&1 & w=$!
run python3 "$tests/py_reader.py" "$c" out.bp >"$R" 2>&1; r=$?
wait $w; ws=$?
[ $r = 0 ] && [ $ws = 0 ] && grep -q "end of stream after 4 steps" "$R" && no_segment_left s1
check "C++ writer, Python reader: 4 steps of a 64x48 global array in 2 blocks, value, string, local array, attribute" $? "$W" "$R"

c=$(config s2 StreamName=s2)
run "$bin/cxx_writer" "$c" out.bp 3 64 48 >"$W" 2>&1 & w=$!
run python3 "$tests/py_reader.py" "$c" out.bp 10 5 40 30 >"$R" 2>&1; r=$?
wait $w; ws=$?
[ $r = 0 ] && [ $ws = 0 ] && grep -q "sel 10+40,5+30" "$R" && grep -q "after 3 steps" "$R"
check "C++ writer, Python reader of a selection across both blocks" $? "$W" "$R"

c=$(config s3) # no StreamName: the stream is the IO's name
run python3 "$tests/py_writer.py" "$c" out.bp 3 32 16 >"$W" 2>&1 & w=$!
run "$bin/cxx_reader" "$c" out.bp >"$R" 2>&1; r=$?
wait $w; ws=$?
[ $r = 0 ] && [ $ws = 0 ] && grep -q "after 3 steps" "$R" && no_segment_left SimulationOutput
check "Python writer, C++ reader" $? "$W" "$R"

c=$(config cw StreamName=cw)
run "$bin/c_writer_static" cw 3 32 16 >"$W" 2>&1 & w=$!
run python3 "$tests/py_reader.py" "$c" out.bp 5 3 20 10 >"$R" 2>&1; r=$?
wait $w; ws=$?
run "$bin/c_writer" cw 2 32 16 QueueLimit=1 >"$W" 2>&1 & w=$!
run "$bin/cxx_reader" "$c" out.bp >"$R2" 2>&1; r2=$?
wait $w; ws2=$?
[ $r = 0 ] && [ $ws = 0 ] && [ $r2 = 0 ] && [ $ws2 = 0 ] && grep -q "after 3 steps" "$R" &&
    grep -q "after 2 steps" "$R2" && no_segment_left cw
check "C writer API without ADIOS2 (static, then shared) and ADIOS2 Python and C++ readers" $? "$W" "$R" "$R2"
run "$bin/c_writer" cw 1 4 4 QueueLimit=zero >"$W" 2>&1; ws=$?
[ $ws = 1 ] && grep -q 'c_writer: open: clowder engine: parameter QueueLimit="zero" is not an integer' "$W"
check "the C writer API names a bad parameter" $? "$W"

# Zero-copy reading (include/clowder_adios2_read.h): every value of each block checked where the
# writer put it, the blocks as ADIOS2's Engine::BlocksInfo lists them, misuse refused (another type, a block out of range, an unknown variable or
# IO, a block asked after EndStep or after Close).
c=$(config zc StreamName=zc)
run "$bin/cxx_writer" "$c" out.bp 4 64 48 >"$W" 2>&1 & w=$!
run "$bin/zc_reader" "$c" out.bp -1 0 >"$R" 2>&1; r=$?
wait $w; ws=$?
run "$bin/cxx_writer" "$c" out.bp 3 64 48 >"$W" 2>&1 & w=$!
run "$bin/zc_reader" "$c" out.bp 1 0 >"$R2" 2>&1; r2=$?
wait $w; ws2=$?
[ $r = 0 ] && [ $ws = 0 ] && [ $r2 = 0 ] && [ $ws2 = 0 ] && grep -q "after 4 steps" "$R" &&
    grep -q "^step 3 ok blocks 2 elems 3072" "$R" && grep -q "^step 2 ok blocks 2 elems 1536" "$R2" &&
    grep -q "^BlocksInfo: 2 blocks, block 1 start {32,0} count {32,48}" "$R" &&
    grep -q "^refused: float: clowder engine: variable 'field' is double, not float" "$R" &&
    grep -q "^refused: block: .* has 2 block(s), not block 2" "$R" &&
    grep -q "^refused: io: clowder engine: no clowder reader is open on IO 'OtherIO'" "$R" &&
    grep -q "^after EndStep: .*outside BeginStep/EndStep" "$R" &&
    grep -q "^after Close: clowder engine: no clowder reader is open" "$R" && no_segment_left zc
check "zero-copy reader: the whole array (2 blocks) and block 1 read in place, every value right, the blocks ADIOS2's BlocksInfo lists; misuse and use after EndStep refused" $? "$W" "$R" "$R2"

# The same from Python: adios2's bindings for the steps, the engine's call through ctypes.
c=$(config zcpy StreamName=zcpy)
run "$bin/cxx_writer" "$c" out.bp 3 64 48 >"$W" 2>&1 & w=$!
run python3 "$tests/py_zc_reader.py" "$c" out.bp "$bin/libclowder_adios2.so" >"$R" 2>&1; r=$?
wait $w; ws=$?
[ $r = 0 ] && [ $ws = 0 ] && grep -q "after 3 steps" "$R" && grep -q "^step 2 ok blocks 2" "$R" &&
    grep -q "^after end_step: .*outside BeginStep/EndStep" "$R" && no_segment_left zcpy
check "zero-copy reader in Python (ctypes): numpy arrays over both blocks, every value right; refused after end_step" $? "$W" "$R"

# A reader holding step 0 in place for 3 s keeps it unchanged, and another reader is held up
# only by the queue (Block, QueueLimit 2): it reads steps 0 and 1 during the hold, step 2 after.
c=$(config zchold StreamName=zchold QueueLimit=2 RendezvousReaderCount=2)
run "$bin/cxx_writer" "$c" out.bp 5 64 48 >"$W" 2>&1 & w=$!
run "$bin/zc_reader" "$c" out.bp -1 3000 >"$R" 2>&1 & r1=$!
run "$bin/zc_reader" "$c" out.bp -1 0 >"$R2" 2>&1; r2=$?
wait $r1; r1=$?
wait $w; ws=$?
released=$(sed -n 's/^held step 0 for 3000 ms unchanged, released t=//p' "$R")
t1=$(sed -n 's/^step 1 ok .* t=//p' "$R2") t2=$(sed -n 's/^step 2 ok .* t=//p' "$R2")
[ $r1 = 0 ] && [ $r2 = 0 ] && [ $ws = 0 ] && grep -q "after 5 steps" "$R" && grep -q "after 5 steps" "$R2" &&
    [ -n "$released" ] && [ -n "$t1" ] && [ -n "$t2" ] &&
    python3 -c "import sys; sys.exit(0 if $t1 < $released < $t2 else 1)"
check "a reader holding step 0 in place (3 s) sees it unchanged; the other reads steps 0-1 meanwhile and step 2 only after (Block, QueueLimit 2)" $? "$W" "$R" "$R2"

c=$(config s4 StreamName=s4 RendezvousReaderCount=2)
run python3 "$tests/py_writer.py" "$c" out.bp 5 32 16 >"$W" 2>&1 & w=$!
run "$bin/cxx_reader" "$c" out.bp 3 2 20 9 >"$R" 2>&1 & r1=$!
run "$bin/c_reader" "$c" out.bp >"$R2" 2>&1; r2=$?
wait $r1; r1=$?
wait $w; ws=$?
[ $r1 = 0 ] && [ $r2 = 0 ] && [ $ws = 0 ] && grep -q "after 5 steps" "$R" && grep -q "after 5 steps" "$R2"
check "two readers (C++ with a selection, C) of a Python writer see every step (Block)" $? "$W" "$R" "$R2"

# Steps as snapshots: with QueueLimit=1 the writer rewrites step 0's buffer in place for
# step 1 while a slow reader holds step 0, which must keep step 0's values.
c=$(config s7 StreamName=s7 QueueLimit=1 StepSnapshots=true)
rm -f "$scratch/rewritten"
run python3 "$tests/held_step.py" "$c" out.bp writer "$scratch/rewritten" >"$W" 2>&1 & w=$!
run python3 "$tests/held_step.py" "$c" out.bp reader "$scratch/rewritten" >"$R" 2>&1; r=$?
wait $w; ws=$?
[ $r = 0 ] && [ $ws = 0 ] && grep -q "held step 0 unchanged" "$R" && grep -q "after 3 steps" "$R" &&
    no_segment_left s7
check "a slow reader holding step 0 sees it unchanged while the writer rewrites its buffer (snapshot)" $? "$W" "$R"

c=$(config s5 StreamName=s5 RendezvousReaderCount=0 QueueLimit=2)
run "$bin/cxx_writer" "$c" out.bp 12 16 8 -1 100 >"$W" 2>&1 & w=$!
sleep 0.6
run "$bin/cxx_reader" "$c" out.bp >"$R" 2>&1; r=$?
wait $w; ws=$?
first=$(awk '/^step/ {print $2; exit}' "$R")
[ $r = 0 ] && [ $ws = 0 ] && [ "${first:-0}" -ge 2 ] && grep -q "^step 11 ok" "$R"
check "a reader that joins late starts at the queue's oldest step and reads to the end" $? "$W" "$R"

for snapshots in false true; do
    c=$(config s6$snapshots StreamName=s6$snapshots QueueLimit=1 QueueFullPolicy=Discard StepSnapshots=$snapshots)
    run "$bin/cxx_writer" "$c" out.bp 200 256 256 >"$W" 2>&1 & w=$!
    run python3 "$tests/py_reader.py" "$c" out.bp >"$R" 2>&1; r=$?
    wait $w; ws=$?
    [ $r = 0 ] && [ $ws = 0 ] && grep -q "end of stream" "$R" &&
        awk '/^step/ {if ($2 <= last) exit 1; last = $2}' last=-1 "$R" && no_segment_left s6$snapshots
    check "Discard (StepSnapshots=$snapshots): a fast writer never waits; the reader's steps are right and in order ($(grep -c '^step' "$R") of 200)" $? "$W" "$R"
done

c=$(config nosuch StreamName=nosuch OpenTimeoutSecs=1)
run python3 "$tests/py_reader.py" "$c" out.bp >"$R" 2>&1; r=$?
[ $r != 0 ] && grep -q "no stream 'nosuch'" "$R" && ! grep -qi "segmentation\|core dumped" "$R"
check "a Python reader of an unknown stream gets an error naming it" $? "$R"
run "$bin/cxx_reader" "$c" out.bp >"$R" 2>&1; r=$?
[ $r = 1 ] && grep -q "no stream 'nosuch'" "$R"
check "a C++ reader of an unknown stream gets an error naming it" $? "$R"

c=$(config s7 StreamName=s7)
run python3 "$tests/py_writer.py" "$c" out.bp 3 32 16 float32 >"$W" 2>&1 & w=$!
run "$bin/cxx_reader" "$c" out.bp >"$R" 2>&1; r=$?
wait $w; ws=$?
[ $r = 1 ] && [ $ws = 0 ] && grep -q "no double variable 'field'" "$R" && no_segment_left s7
check "a variable of the wrong type: the reader is told, the writer ends well" $? "$W" "$R"

c=$(config s8 StreamName=s8)
run "$bin/cxx_writer" "$c" out.bp 3 64 48 >"$W" 2>&1 & w=$!
run "$bin/cxx_reader" "$c" out.bp 40 0 30 48 >"$R" 2>&1; r=$?
wait $w; ws=$?
[ $r = 1 ] && [ $ws = 0 ] && grep -q "lies outside its shape {64,48}" "$R" && no_segment_left s8
check "a selection outside the shape: the reader gets an error, the writer ends well" $? "$W" "$R"

c=$(config s9 StreamName=s9)
run "$bin/cxx_writer" "$c" out.bp 5 64 48 2 300 >"$W" 2>&1 & w=$!
run python3 "$tests/py_reader.py" "$c" out.bp >"$R" 2>&1; r=$?
wait $w; ws=$?
[ $r = 0 ] && [ $ws = 137 ] && grep -q "after 2 steps" "$R" && no_segment_left s9
check "a writer killed mid-step: the reader gets its 2 whole steps, then EndOfStream; no segment left" $? "$W" "$R"

# A hostile writer (tests/forged_writer.py, libxpmem through ctypes): segments wrong in one way
# each; the reader names what is wrong. "none" forges a valid step, so the others differ from a
# readable stream in that one way only.
for case in none control count offset type record; do
    c=$(config "forged-$case" "StreamName=forged-$case")
    python3 "$tests/forged_writer.py" "$root/xemem/build/lib/libxpmem.so.0" "forged-$case" $case 30 >"$W" 2>&1 & w=$!
    run "$bin/cxx_reader" "$c" out.bp >"$R" 2>&1; r=$?
    kill $w 2>/dev/null; wait $w 2>/dev/null
    case $case in
    none) expected="step 0 WRONG shape 4x4" ;; # zeros, where cxx_writer's formula wants more
    control) expected="control segment has bad sizes" ;;
    count) expected="step 0 is malformed: variable 'field': its count and size disagree" ;;
    offset) expected="step 0 is malformed: the data of 'field' lies outside the segment" ;;
    type) expected="step 0 is malformed: variable 'field' has unknown type 'quaternion'" ;;
    record) expected="step 0 is malformed: a variable record has bad sizes" ;;
    esac
    [ $r = 1 ] && grep -q "$expected" "$R"
    check "a forged stream ($case): the reader says \"$expected\"" $? "$W" "$R"
done

c=$(config bad QueueFullPolicy=Sometimes)
run "$bin/cxx_writer" "$c" out.bp 1 4 4 >"$W" 2>&1; ws=$?
[ $ws = 1 ] && grep -q 'parameter QueueFullPolicy="Sometimes" is not Block or Discard' "$W"
check "a malformed parameter value is refused, naming it" $? "$W"
c=$(config unknown QueueLimt=3)
run "$bin/cxx_writer" "$c" out.bp 1 4 4 >"$W" 2>&1; ws=$?
[ $ws = 1 ] && grep -q 'unknown parameter QueueLimt' "$W"
check "an unknown parameter is refused, naming it" $? "$W"
c=$(config spaced "StreamName=two words")
run "$bin/cxx_writer" "$c" out.bp 1 4 4 >"$W" 2>&1; ws=$?
[ $ws = 1 ] && grep -q "stream name 'two words' must be printable ASCII without spaces" "$W"
check "a stream name XEMEM cannot take is refused, naming it" $? "$W"
sed "s|$bin/libclowder_adios2.so|$scratch/missing.so|" "$(config plain)" >"$scratch/missing.xml"
run "$bin/cxx_writer" "$scratch/missing.xml" out.bp 1 4 4 >"$W" 2>&1; ws=$?
[ $ws = 1 ] && grep -qi "missing.so" "$W"
check "a PluginLibrary that does not exist is an error, not a crash" $? "$W"
head -c 150 "$(config plain)" >"$scratch/cut.xml"
run python3 "$tests/py_reader.py" "$scratch/cut.xml" out.bp >"$R" 2>&1; r=$?
[ $r = 1 ] && ! grep -qi "segmentation\|core dumped" "$R"
check "a cut-off XML configuration is an error, not a crash" $? "$R"

kill -0 $broker_pid 2>/dev/null
check "the broker is still up" $? "$scratch/broker.log"

# The C writer in an LWK enclave, with a clowderd of its own (skipped without /dev/kvm).
env -u CLOWDER_XEMEM_SOCKET coupling/adios2/lwk-test.sh >"$scratch/lwk" 2>&1
status=$?
cat "$scratch/lwk"
if [ $status != 0 ]; then failed=$((failed + 1)); elif grep -q '^ok' "$scratch/lwk"; then passed=$((passed + 1)); fi
echo "$passed passed, $failed failed"
[ $failed = 0 ]
