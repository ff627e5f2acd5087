#!/usr/bin/env bash
# XPMEM attach throughput (XEMEM, HPDC'15, Fig. 5/6 and Table 2) and control latency, host ->
# host and across enclaves. Writes docs/results/xemem-attach.md.
#
# host -> host: regions of 128 MiB to 1 GiB, 4 KiB (converted private memory) and 2 MiB
#   (hugetlb memfd) backing; attach only (lazy, as XPMEM attaches locally), attach with every
#   page mapped at once (CLOWDER_XEMEM_PREFAULT=1, eager like XEMEM's cross-enclave attach),
#   attach + touching one int per page, attach + reading everything; 1/2/4 process pairs;
#   get/release and make/remove latency.
# Across enclaves, under a private clowderd with persistent LWK enclaves (1 core, 1 GiB each):
#   LWK -> host  the owner is an LWK job (xemem_make, a named segment), the attacher a host
#                process; 4 KiB / 2 MiB = the enclave's RAM backing (--hugepages)
#   host -> LWK  the owner is a host process, the attacher an LWK job timing itself with
#                clock_gettime; 4 KiB / 2 MiB = the host owner's backing; beside it the job's
#                attach of its own memory of the same size (the kernel's share) and the VMM's
#                region add/remove for the same memory (region_bench.py)
#   LWK -> LWK   the owner is an LWK job in one enclave, the attacher a job in another (the
#                daemon adds the owner's pages, ranges of its RAM memfd, to the attacher's
#                machine as regions); 4 KiB / 2 MiB = the owner enclave's RAM backing
#   1/2/4 concurrent LWK -> host pairs; get/release and make/remove from an LWK job through
#   the daemon, and get/release of an LWK job's segment from a host process.
#
#   ATTACHES=500 (attach-only iterations, the paper's count)  TOUCHES=20 (the other modes)
#   CROSS_ATTACHES=500 (the paper's count across enclaves too)  PAIR_ATTACHES=100
#   CROSS_TOUCHES=21 (attach + touch/read across enclaves)  SIZES="128 256 512 1024"
#   CROSS=0 skips the cross-enclave part (it needs /dev/kvm, musl-gcc and `make build`).
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
# The settings, checked before anything is built: a count from 1 up, sizes in MiB.
refuse() { echo "xemem/bench: $1" >&2; exit 2; }
count() { # NAME VALUE
    [[ $2 =~ ^[1-9][0-9]{0,6}$ ]] || refuse "$1 must be a whole number from 1 up, not '$2'"
    echo "$2"
}
attaches=$(count ATTACHES "${ATTACHES:-500}")
touches=$(count TOUCHES "${TOUCHES:-20}")
cross_touches=$(count CROSS_TOUCHES "${CROSS_TOUCHES:-21}")
cross_attaches=$(count CROSS_ATTACHES "${CROSS_ATTACHES:-500}")
pair_attaches=$(count PAIR_ATTACHES "${PAIR_ATTACHES:-100}")
sizes=${SIZES:-"128 256 512 1024"}
[ -n "${sizes// /}" ] || refuse "SIZES names no size"
for size in $sizes; do
    [[ $size =~ ^[1-9][0-9]{0,4}$ ]] || refuse "SIZES takes region sizes in MiB (128 256 512 1024), not '$size'"
done
case ${CROSS:-1} in 0 | 1) ;; *) refuse "CROSS is 0 (host only) or 1, not '$CROSS'" ;; esac
control_iterations=2000
# A control operation from an LWK job takes tens of ms (see the results): fewer samples.
lwk_control_iterations=100
# Pairs across enclaves: 128 MiB, because clowderd's XEMEM node gives up on an attach after 5
# tries 100 ms apart, and a larger region's resolve in a loaded owner enclave can take longer.
pair_mib=128
# Attacher enclaves hold a local-read buffer (halved until it fits); an owner enclave holds
# the exported region beside the job itself.
enclave_mem=1G
owner_enclave_mem=2G

make -s -C "$root/xemem" all >/dev/null
# The broker optimized, as clowderd carries it (a debug build adds ~50 us to every round trip).
(cd "$root" && cargo build -q --release -p xemem-host --bin xemem-broker)
target=$(cd "$root" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
scratch=$(mktemp -d /tmp/clowder-xemem-bench.XXXXXX)
for program in attach_bench control_bench; do
    cc -O2 -std=gnu11 -Wall -pthread -I"$root/xemem/build/include" -o "$scratch/$program" $program.c \
        -L"$root/xemem/build/lib" -Wl,-rpath,"$root/xemem/build/lib" -lxpmem
done

# What the cross-enclave part needs; without it, its rows say why they are missing.
bin=$root/target/release
kernel=$root/kernels/target/x86_64-unknown-none/release/lwk
cross_missing=
if [ "${CROSS:-1}" = 0 ]; then
    cross_missing="skipped (CROSS=0)"
elif [ ! -w /dev/kvm ]; then
    cross_missing="no /dev/kvm"
elif ! command -v musl-gcc >/dev/null; then
    cross_missing="no musl-gcc"
else
    for needed in "$bin/clowderd" "$bin/clowder" "$bin/clowder-vmm" "$kernel"; do
        [ -x "$needed" ] || [ -f "$needed" ] || cross_missing="no $needed (make build)"
    done
fi
if [ -z "$cross_missing" ]; then
    # Static LWK jobs: musl against our header and a musl libxpmem.a (as xemem/lwk-test.sh).
    headers=$root/xemem/build/musl/kernel-headers
    mkdir -p "$headers"
    ln -sfn /usr/include/linux "$headers/linux"
    ln -sfn "/usr/include/$(gcc -print-multiarch)/asm" "$headers/asm"
    ln -sfn /usr/include/asm-generic "$headers/asm-generic"
    make -s -C "$root/xemem" CC="musl-gcc -isystem $headers" BUILD=build/musl build/musl/lib/libxpmem.a
    for program in attach_bench control_bench; do
        musl-gcc -isystem "$headers" -static -O2 -Wall -I"$root/xemem/include" -o "$scratch/$program-lwk" $program.c \
            "$root/xemem/build/musl/lib/libxpmem.a" -lpthread
    done
fi

export CLOWDER_XEMEM_SOCKET=$scratch/xemem.sock
"$target/release/xemem-broker" 2>"$scratch/broker.log" &
broker_pid=$!
daemons=()
# 2 MiB rows need the largest region in free hugepages; reserve them for this run if we may.
hugepages_before=$(cat /proc/sys/vm/nr_hugepages)
cleanup() {
    # Enclaves still up (a failed run): remove them before their daemons go.
    while read -r dir enclave; do
        CLOWDER_SOCKET=$dir/clowderd.sock "$bin/clowder" enclave rm "$enclave" >/dev/null 2>&1 || true
    done < <(cat "$scratch/enclaves" 2>/dev/null)
    for pid in $broker_pid "${daemons[@]}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    if [ "$(cat /proc/sys/vm/nr_hugepages)" != "$hugepages_before" ]; then
        echo "$hugepages_before" > /proc/sys/vm/nr_hugepages || true
    fi
    rm -rf "$scratch"
}
trap cleanup EXIT
for _ in $(seq 100); do [ -S "$CLOWDER_XEMEM_SOCKET" ] && break; sleep 0.05; done
largest=$(echo $sizes | tr ' ' '\n' | sort -n | tail -1)
# The host owner's largest region, a 2 MiB-backed owner enclave beside it, and the attacher
# enclave on 2 MiB pages too (its local read is the limit attach + read is held against: with
# 4 KiB host pages under it, that limit would be lower than a 2 MiB source allows).
needed=$((largest / 2 + 8 + 1024 + 8 + 512 + 8))
free_huge=$(cat /sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages)
if [ "$free_huge" -lt "$needed" ] && [ "$(id -u)" -eq 0 ]; then
    echo $((hugepages_before + needed - free_huge)) > /proc/sys/vm/nr_hugepages || true
fi
free_huge=$(cat /sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages)
attacher_backing=$([ "$free_huge" -ge "$needed" ] && echo 2m || echo 4k)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date +%s)

# Every measurement is one line in $rows: DIRECTION BACKING MODE MIB ITERATIONS GB/S MEDIAN_US
# DETACH_US LOCAL_GB/S LOCAL_MIB REREAD_GB/S, or DIRECTION BACKING - MIB skip REASON...
rows=$scratch/rows
: >"$rows"
# And every owner's read of its own region in $owner_rows: DIRECTION BACKING MIB GB/S.
owner_rows=$scratch/owner-reads
: >"$owner_rows"
record() { # DIRECTION BACKING, then attach_bench's lines on stdin (anything else passes by)
    local mode rest
    while read -r mode rest; do
        case $mode in
        attach | prefault | touch | read | self) echo "$1 $2 $mode $rest" | tee -a "$rows" >&2 ;;
        owner-read) echo "$1 $2 $rest" | tee -a "$owner_rows" >&2 ;;
        *) echo "$mode $rest" >&2 ;;
        esac
    done
}
skip() { # DIRECTION BACKING MIB REASON...
    local direction=$1 backing=$2 mib=$3
    shift 3
    echo "$direction $backing - $mib skip $*" | tee -a "$rows" >&2
}

for backing in 4k 2m; do
    for mib in $sizes; do
        if [ "$backing" = 2m ] && [ $((mib / 2)) -gt "$free_huge" ]; then
            skip host-host 2m "$mib" "needs $((mib / 2)) free hugepages, $free_huge free"
            continue
        fi
        for mode in attach prefault touch read; do
            iterations=$([ $mode = attach ] && echo "$attaches" || echo "$touches")
            "$scratch/attach_bench" "$backing" "$mib" "$iterations" "$mode" | record host-host "$backing"
        done
    done
done

# Concurrent pairs (Fig. 6's 1/2/4 enclave-process pairs, here host process pairs): each pair
# is one owner and one attacher; the figure is the sum of the pairs' throughputs.
pairs_rows=$scratch/pairs
: >"$pairs_rows"
for pairs in 1 2 4; do
    for mode in attach touch; do
        iterations=$([ $mode = attach ] && echo "$attaches" || echo "$touches")
        pair_pids=()
        for p in $(seq "$pairs"); do
            "$scratch/attach_bench" 4k $pair_mib "$iterations" "$mode" >"$scratch/pair.$p" &
            pair_pids+=($!)
        done
        wait "${pair_pids[@]}"
        total=$(cat "$scratch"/pair.* | awk '$1 != "first" { s += $4 } END { printf "%.2f", s }')
        rm -f "$scratch"/pair.*
        echo "host-host $pairs $mode $iterations $total $pairs" | tee -a "$pairs_rows" >&2
    done
done
control_rows=$scratch/control
"$scratch/control_bench" $control_iterations | sed 's/^/host-host /' | tee "$control_rows" >&2

# --- across enclaves -------------------------------------------------------------------------
# A private daemon (socket and VMM sockets in its own directory). A job that ends with hundreds
# of MiB mapped keeps the LWK busy for seconds (emulated kernel code here), longer than the
# default 5 s Ping timeout: allow two minutes.
start_daemon() { # DIRECTORY
    mkdir -p "$1"
    "$bin/clowderd" --vmm "$bin/clowder-vmm" --kernel "$kernel" --socket "$1/clowderd.sock" \
        --xemem-socket "$1/xemem.sock" --ping-timeout 120000 >"$1/clowderd.log" 2>&1 &
    daemons+=($!)
    for _ in $(seq 100); do [ -S "$1/xemem.sock" ] && [ -S "$1/clowderd.sock" ] && return; sleep 0.05; done
    echo "xemem bench: clowderd did not start (see $1/clowderd.log)" >&2
    return 1
}
# Runs a command with the daemon's API and XEMEM sockets. It execs: call it in a subshell of
# its own (a pipeline, or with &, so that $! is the program itself and can be stopped).
on_daemon() { # DIRECTORY COMMAND...
    local dir=$1
    shift
    CLOWDER_SOCKET=$dir/clowderd.sock CLOWDER_XEMEM_SOCKET=$dir/xemem.sock exec "$@"
}
job() { # DIRECTORY ENCLAVE PROGRAM ARGS...: an LWK job, its output on stdout; execs, as on_daemon
    local dir=$1 enclave=$2 program=$3
    shift 3
    cd "$scratch"
    on_daemon "$dir" "$bin/clowder" run --enclave "$enclave" "$scratch/$program-lwk" "$@"
}
create_enclave() { # DIRECTORY NAME [MEMORY [--hugepages]]
    (on_daemon "$1" "$bin/clowder" enclave create --name "$2" --cores 1 --mem "${3:-$enclave_mem}" ${4:-} >/dev/null)
    echo "$1 $2" >>"$scratch/enclaves"
}
remove_enclave() { # DIRECTORY NAME
    (on_daemon "$1" "$bin/clowder" enclave rm "$2" >/dev/null)
    grep -vxF "$1 $2" "$scratch/enclaves" >"$scratch/enclaves.left" || true
    mv "$scratch/enclaves.left" "$scratch/enclaves"
}
# An owner waits for its attacher's signal; an attacher that failed never sends it, so the
# owner is stopped (an LWK job ends with its `clowder run`).
finish_owner() { # OWNER_PID ATTACHER_STATUS WHAT
    if [ "$2" != 0 ]; then
        kill "$1" 2>/dev/null || true
        echo "xemem bench: $3: the attacher failed (status $2)" >&2
    fi
    wait "$1" 2>/dev/null || [ "$2" != 0 ] || { echo "xemem bench: $3: the owner failed" >&2; return 1; }
    return "$2"
}
owner_seconds=600
phase() { echo "xemem bench: $* ($(( $(date +%s) - started )) s)" >&2; }

cross_failures=0
region_rows=$scratch/regions
: >"$region_rows"
if [ -z "$cross_missing" ]; then
    main=$scratch/daemon-main
    start_daemon "$main"

    # An LWK job owns (in an owner enclave of each backing); the attacher is a host process
    # (LWK -> host) or a job in the attacher enclave (LWK -> LWK).
    from_lwk_owner() { # DIRECTION (lwk-host | lwk-lwk) LABEL
        local direction=$1 label=$2 backing flag mib name owner status
        for backing in 4k 2m; do
            phase "$label, $backing"
            flag=$([ $backing = 2m ] && echo --hugepages || true)
            create_enclave "$main" owner "$owner_enclave_mem" "$flag"
            for mib in $sizes; do
                name=$direction-owned-$$-$backing-$mib
                job "$main" owner attach_bench own "$name" 4k "$mib" $owner_seconds >"$scratch/owner.out" 2>&1 &
                owner=$!
                status=0
                if [ "$direction" = lwk-host ]; then
                    (on_daemon "$main" taskset -c 0 "$scratch/attach_bench" attach "$name" "$mib" "$cross_attaches" "$cross_touches")
                else
                    job "$main" attacher attach_bench attach "$name" "$mib" "$cross_attaches" "$cross_touches"
                fi | record "$direction" "$backing" || status=$?
                finish_owner $owner $status "$label $backing $mib MiB" || cross_failures=$((cross_failures + 1))
                sed -n '/^owner-read /p' "$scratch/owner.out" | record "$direction" "$backing"
            done
            remove_enclave "$main" owner
        done
    }
    from_lwk_owner lwk-host "LWK -> host"

    # host -> LWK: the host process owns; the LWK job attaches and times itself.
    host_to_lwk() { # BACKING MIB [MODE...]
        local backing=$1 mib=$2 name=host-owned-$$-$1-$2 owner status=0
        shift 2
        on_daemon "$main" taskset -c 0 "$scratch/attach_bench" own "$name" "$backing" "$mib" $owner_seconds >"$scratch/owner.out" 2>&1 &
        owner=$!
        job "$main" attacher attach_bench attach "$name" "$mib" "$cross_attaches" "$cross_touches" "$@" | record host-lwk "$backing" || status=$?
        finish_owner $owner $status "host -> LWK $backing $mib MiB" || return
        sed -n '/^owner-read /p' "$scratch/owner.out" | record host-lwk "$backing"
    }
    create_enclave "$main" attacher "$enclave_mem" "$([ "$attacher_backing" = 2m ] && echo --hugepages || true)"
    # What does not grow with the size: the attach of a 1 MiB segment.
    phase "host -> LWK, 1 MiB"
    host_to_lwk 4k 1 attach || cross_failures=$((cross_failures + 1))
    for backing in 4k 2m; do
        phase "host -> LWK, $backing"
        for mib in $sizes; do
            if [ "$backing" = 2m ] && [ $((mib / 2)) -gt "$free_huge" ]; then
                skip host-lwk 2m "$mib" "needs $((mib / 2)) free hugepages, $free_huge free"
                continue
            fi
            host_to_lwk "$backing" "$mib" || cross_failures=$((cross_failures + 1))
            # The VMM's part of those attaches: its region add and remove, asked as clowderd asks.
            python3 region_bench.py "$main/attacher.vmm.sock" "$backing" "$mib" "$touches" | tee -a "$region_rows" >&2 \
                || cross_failures=$((cross_failures + 1))
        done
    done

    # LWK -> LWK: the owner job in one enclave, the attacher job in another (created above).
    from_lwk_owner lwk-lwk "LWK -> LWK"

    # Control operations across enclaves: an LWK job against a host segment (get/release) and
    # its own named make/remove; a host process against an LWK job's segment.
    phase "control operations"
    name=host-control-$$
    on_daemon "$main" taskset -c 0 "$scratch/attach_bench" own "$name" 4k 1 $owner_seconds >"$scratch/owner.out" 2>&1 &
    owner=$!
    status=0
    job "$main" attacher control_bench named "$name" 1 $lwk_control_iterations | sed 's/^/lwk-job /' | tee -a "$control_rows" >&2 || status=$?
    finish_owner $owner $status "control from an LWK job" || cross_failures=$((cross_failures + 1))
    # 2 MiB: on an attacher enclave with hugetlb RAM a host process can attach only whole 2 MiB
    # pages (it signals the owner through an attach at the end).
    name=lwk-control-$$
    job "$main" attacher attach_bench own "$name" 4k 2 $owner_seconds >"$scratch/owner.out" 2>&1 &
    owner=$!
    status=0
    (on_daemon "$main" taskset -c 0 "$scratch/control_bench" named "$name" 2 $control_iterations) | sed 's/^/host-process /' | tee -a "$control_rows" >&2 || status=$?
    finish_owner $owner $status "control from a host process" || cross_failures=$((cross_failures + 1))
    remove_enclave "$main" attacher

    # Concurrent LWK -> host pairs: one owner enclave (1 core) and one host attacher each. A
    # daemon gives a core to one enclave only, so 4 pairs on 2 cores take a second daemon. A
    # pair whose attacher fails is left out of the sum, and its error is kept.
    second=$scratch/daemon-second
    start_daemon "$second"
    pair_dir() { [ "$1" -le 2 ] && echo "$main" || echo "$second"; }
    for pairs in 1 2 4; do
        phase "$pairs concurrent LWK -> host pairs"
        for p in $(seq "$pairs"); do
            create_enclave "$(pair_dir "$p")" "pair$p" 512M
        done
        owners=()
        attachers=()
        for p in $(seq "$pairs"); do
            name=pair-$$-$pairs-$p
            job "$(pair_dir "$p")" "pair$p" attach_bench own "$name" 4k $pair_mib $owner_seconds >"$scratch/pair-owner.$p" 2>&1 &
            owners+=($!)
            on_daemon "$(pair_dir "$p")" "$scratch/attach_bench" attach "$name" $pair_mib "$pair_attaches" "$cross_touches" attach touch \
                >"$scratch/pair.$p" 2>"$scratch/pair-error.$p" &
            attachers+=($!)
        done
        for p in $(seq "$pairs"); do
            status=0
            wait "${attachers[p - 1]}" || status=$?
            finish_owner "${owners[p - 1]}" $status "pair $p of $pairs" || true
        done
        for mode in attach touch; do
            iterations=$([ $mode = attach ] && echo "$pair_attaches" || echo "$cross_touches")
            total=$(cat "$scratch"/pair.* | awk -v mode=$mode '$1 == mode { s += $4; n++ } END { printf "%.2f %d", s, n }')
            echo "lwk-host $pairs $mode $iterations $total" | tee -a "$pairs_rows" >&2
        done
        # The first error of a pair that failed, for the results.
        for p in $(seq "$pairs"); do
            if [ -s "$scratch/pair-error.$p" ]; then
                echo "$pairs $(head -1 "$scratch/pair-error.$p")" >>"$scratch/pair-errors"
            fi
            remove_enclave "$(pair_dir "$p")" "pair$p"
        done
        rm -f "$scratch"/pair.* "$scratch"/pair-owner.* "$scratch"/pair-error.*
    done
fi
elapsed=$(( $(date +%s) - started ))
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

out=$root/docs/results/xemem-attach.md
mkdir -p "$(dirname "$out")"
touch "$scratch/pair-errors"
# The Linux-VM part is bench/xemem/vm-table2.sh's (and hand-written notes): kept as it is.
vm_part=$(sed -n '/^## Linux VM enclaves/,$p' "$out" 2>/dev/null || true)
python3 results.py "$rows" "$owner_rows" "$pairs_rows" "$control_rows" "$scratch/pair-errors" "$region_rows" \
    --date "$(date -u '+%Y-%m-%d %H:%M UTC')" --kernel "$(uname -r)" --cpus "$(nproc)" \
    --load "$load_before" --load-after "$load_after" --elapsed "$elapsed" \
    --attaches "$attaches" --cross-attaches "$cross_attaches" --pair-attaches "$pair_attaches" --touches "$touches" --cross-touches "$cross_touches" --pair-mib $pair_mib \
    --control "$control_iterations" --lwk-control "$lwk_control_iterations" --cross-missing "$cross_missing" --attacher-backing "$attacher_backing" >"$out"
[ -z "$vm_part" ] || printf '\n%s\n' "$vm_part" >>"$out"
cat "$out"
python3 "$root/bench/plot.py" xemem
if [ "$cross_failures" != 0 ]; then
    echo "xemem bench: $cross_failures cross-enclave runs failed" >&2
    exit 1
fi
