#!/usr/bin/env bash
# The XEMEM paper's in-situ evaluation (HPDC'15 Figs. 6-8) and the Hobbes isolation claim,
# measured here; writes docs/results/insitu.md and its PNG figures (bench/insitu/results.py).
#
#   bench/insitu/run.sh [matrix] [interference] [noise] [scaling]     (default: all four)
#
# matrix        every configuration x workflow of scripts/insitu.sh, RUNS times (Fig. 8)
# interference  the simulation as a host process, in an LWK enclave, and in an LWK enclave of a
#               clowderd with --isolate-cores, RUNS times each, idle and beside each of three
#               stress-ng neighbours on the host (Hobbes: sd 0.03-0.15 s vs 0.20 s for one OS)
# noise         selfish-detour in a 1-core LWK enclave while a host process attaches 4 KiB,
#               2 MiB and 1 GiB of its memory once a second for 10 s (Fig. 7)
# scaling       attach throughput of 1, 2, 4 and 8 enclave/attacher pairs (Fig. 6)
#
#   RUNS=10  DATA_MB=32 (the analytics' data; the paper's 512)  GRID="48 48 48"
#   ITERATIONS=600 INTERVAL=40 (the paper's 15 communication points)  ROUNDS=1
#   PAIR_MIB=128 PAIR_ATTACHES=50
#   CONFIGS=a,b,c,d (the matrix's configurations; e, the analytics in a Linux enclave, is left
#   out by default: each of its runs first-touches the analytics' arrays in an emulated guest
#   kernel, about a second a MiB, and spends seconds an interval there; CONFIGS=all adds it)
# Each part writes its TSV under docs/results/insitu/; the page is drawn from whichever TSVs
# exist, so one part can be rerun alone. Installs stress-ng (apt) and matplotlib (pip) if missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
refuse() { echo "bench/insitu: $1" >&2; exit 2; }
count() { # NAME VALUE
    [[ $2 =~ ^[1-9][0-9]{0,6}$ ]] || refuse "$1 must be a whole number from 1 up, not '$2'"
    echo "$2"
}
runs=$(count RUNS "${RUNS:-10}")
[[ ${DATA_MB:-32} =~ ^[0-9]{1,3}$ ]] && [ "${DATA_MB:-32}" -le 512 ] || refuse "DATA_MB is 0 to 512 MiB, not '$DATA_MB'"
data_mb=${DATA_MB:-32}
read -ra grid <<<"${GRID:-48 48 48}"
[ ${#grid[@]} = 3 ] || refuse "GRID is three numbers, not '${GRID:-}'"
for n in "${grid[@]}"; do count GRID "$n" >/dev/null; done
iterations=$(count ITERATIONS "${ITERATIONS:-600}")
interval=$(count INTERVAL "${INTERVAL:-40}")
rounds=$(count ROUNDS "${ROUNDS:-1}")
pair_mib=$(count PAIR_MIB "${PAIR_MIB:-128}")
pair_attaches=$(count PAIR_ATTACHES "${PAIR_ATTACHES:-50}")
configs=${CONFIGS:-a,b,c,d}
[[ $configs =~ ^[a-z,-]+$ ]] || refuse "CONFIGS is a comma-separated list of scripts/insitu.sh's configurations, not '$configs'"
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(matrix interference noise scaling)
for part in "${parts[@]}"; do
    case $part in matrix | interference | noise | scaling) ;; *) refuse "unknown part '$part' (matrix, interference, noise, scaling)" ;; esac
done
[ -e /dev/kvm ] || { echo "bench/insitu: /dev/kvm is missing: enclaves need KVM" >&2; exit 1; }

# What the parts need from the registries, installed quietly when missing.
command -v stress-ng >/dev/null || { apt-get -qq update && apt-get -qq install -y stress-ng >/dev/null; }
python3 -c 'import matplotlib' 2>/dev/null || pip install -q matplotlib 2>/dev/null \
    || pip install -q --break-system-packages matplotlib

out=$root/docs/results/insitu
mkdir -p "$out"
bin=$root/target/release
apps=$root/build/apps
make -s -C apps >/dev/null
insitu_args=(--data-mb "$data_mb" "${grid[@]}" "$iterations" "$interval" "$rounds")
scratch=$(mktemp -d /tmp/clowder-insitu-bench.XXXXXX)
daemons=()
stressor=
cleanup() {
    [ -z "$stressor" ] || { kill "$stressor" 2>/dev/null || true; wait "$stressor" 2>/dev/null || true; }
    while read -r dir enclave; do
        CLOWDER_SOCKET=$dir/clowderd.sock "$bin/clowder" enclave rm "$enclave" >/dev/null 2>&1 || true
    done < <(cat "$scratch/enclaves" 2>/dev/null)
    for pid in "${daemons[@]}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$scratch"
}
trap cleanup EXIT
note() { echo "bench/insitu: $* ($(date -u +%H:%M:%S))" >&2; }
# The machine, once per part: its header line in the results.
describe() { # PART
    printf '%s\t%s\t%s CPUs\t%s\tload %s\t%s\n' "$1" "$(date -u '+%Y-%m-%d %H:%M UTC')" "$(nproc)" \
        "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" "$(cut -d' ' -f1-3 /proc/loadavg)" \
        "RUNS=$runs DATA_MB=$data_mb GRID=${grid[*]} ITERATIONS=$iterations INTERVAL=$interval ROUNDS=$rounds PAIR_MIB=$pair_mib PAIR_ATTACHES=$pair_attaches" \
        >>"$out/machine.tsv"
}
start_daemon() { # DIRECTORY [OPTION...]: a private clowderd (an LWK job exporting 1 GiB keeps its kernel busy: long pings)
    local dir=$1
    shift
    mkdir -p "$dir"
    "$bin/clowderd" --vmm "$bin/clowder-vmm" --socket "$dir/clowderd.sock" --xemem-socket "$dir/xemem.sock" \
        --ping-timeout 120000 "$@" >"$dir/clowderd.log" 2>&1 &
    daemons+=($!)
    for _ in $(seq 200); do [ -S "$dir/xemem.sock" ] && [ -S "$dir/clowderd.sock" ] && return; sleep 0.05; done
    echo "bench/insitu: clowderd did not start (see $dir/clowderd.log)" >&2
    return 1
}
on_daemon() { # DIRECTORY COMMAND...: execs, so call it in a subshell of its own
    local dir=$1
    shift
    CLOWDER_SOCKET=$dir/clowderd.sock CLOWDER_XEMEM_SOCKET=$dir/xemem.sock exec "$@"
}
# A core another daemon's --isolate-cores holds (tests run here too) is waited for, a minute at most.
create_enclave() { # DIRECTORY NAME CORE MEMORY
    for _ in $(seq 30); do
        if (on_daemon "$1" "$bin/clowder" enclave create --name "$2" --core-list "$3" --mem "$4") >"$scratch/create.out" 2>&1; then
            echo "$1 $2" >>"$scratch/enclaves"
            return
        fi
        grep -q "not online or not allowed" "$scratch/create.out" || break
        sleep 2
    done
    cat "$scratch/create.out" >&2
    return 1
}
remove_enclave() { # DIRECTORY NAME
    (on_daemon "$1" "$bin/clowder" enclave rm "$2" >/dev/null) || true
    grep -vxF "$1 $2" "$scratch/enclaves" >"$scratch/enclaves.left" || true
    mv "$scratch/enclaves.left" "$scratch/enclaves"
}
# Starts an LWK job exporting MIB as NAME and spinning SECONDS (insitu-noise); waits until the
# segment exists. Sets $job to the client's pid; its output goes to FILE.
start_owner() { # DIRECTORY ENCLAVE NAME MIB SECONDS FILE
    (on_daemon "$1" "$bin/clowder" run --enclave "$2" "$apps/insitu-noise" "$3" "$4" "$5") >"$6" 2>&1 &
    job=$!
    for _ in $(seq 1200); do
        grep -q "^insitu-noise: made" "$6" && return
        kill -0 "$job" 2>/dev/null || break
        sleep 0.1
    done
    echo "bench/insitu: the owner job $3 did not export its memory:" >&2
    cat "$6" >&2
    return 1
}

matrix() {
    note "matrix: $runs runs of every configuration x workflow"
    describe matrix
    : >"$out/matrix.tsv"
    scripts/insitu.sh --config "$configs" --repeat "$runs" --tsv "$out/matrix.tsv" "${insitu_args[@]}" | grep -v '^clowder: populating' || true
}

# The three neighbours on the host's cores: all of them, as a co-located job would take them.
stress_command() { # NAME
    local cpus
    cpus=$(nproc)
    case $1 in
        cpu-memory) echo "stress-ng --cpu $cpus --vm 1 --vm-bytes 1G --vm-keep" ;;
        page-cache) echo "stress-ng --hdd $cpus --hdd-bytes 512M --temp-path $scratch" ;;
        fork-burst) echo "stress-ng --fork $cpus --fork-max 64" ;;
    esac
}
interference() {
    note "interference: the simulation as a host process, in an LWK enclave, and isolated; idle and under three neighbours"
    describe interference
    : >"$out/interference.tsv"
    local load placement args tsv
    for load in idle cpu-memory page-cache fork-burst; do
        stressor=
        if [ "$load" != idle ]; then
            # shellcheck disable=SC2046
            $(stress_command "$load") --timeout 3600 --quiet &
            stressor=$!
            sleep 2
        fi
        for placement in host-process lwk-enclave lwk-isolated; do
            note "interference: $load, $placement"
            case $placement in
                host-process) args=(--config host-xemem) ;;
                lwk-enclave) args=(--config lwk-host) ;;
                lwk-isolated) args=(--config lwk-host --isolate-cores) ;;
            esac
            tsv=$scratch/interference.tsv
            : >"$tsv"
            scripts/insitu.sh "${args[@]}" --workflow async-once --repeat "$runs" --tsv "$tsv" "${insitu_args[@]}" \
                | grep -v '^clowder: populating' || true
            sed "s/^/$load\t$placement\t/" "$tsv" >>"$out/interference.tsv"
        done
        if [ -n "$stressor" ]; then
            kill "$stressor" 2>/dev/null || true
            wait "$stressor" 2>/dev/null || true
            stressor=
        fi
    done
}

noise() {
    note "noise: selfish-detour in a 1-core LWK enclave, a host process attaching its memory once a second"
    describe noise
    : >"$out/noise.tsv"
    local dir=$scratch/noise size kib name
    # The enclave's core free of host tasks: on this loaded 2-core machine, host work preempting
    # the vCPU thread would hide the attaches' detours (77% of a test run's time was lost so).
    start_daemon "$dir" --isolate-cores
    create_enclave "$dir" noise "$(( $(nproc) - 1 ))" 1536M
    for size in baseline 4KiB 2MiB 1GiB; do
        name=noise-$$-$size
        start_owner "$dir" noise "$name" 1024 12 "$scratch/noise.out"
        case $size in 4KiB) kib=4 ;; 2MiB) kib=2048 ;; 1GiB) kib=1048576 ;; baseline) kib= ;; esac
        if [ -n "$kib" ]; then
            (on_daemon "$dir" taskset -c 0 "$apps/insitu-attach" "$name" "$kib" 10 1000) >"$scratch/attach.out" 2>&1 \
                || { cat "$scratch/attach.out" >&2; note "noise: the $size attaches failed"; }
            sed -n "s/^attach \(.*\) \(.*\)/attach\t$size\t\1\t\2/p" "$scratch/attach.out" | tr ' ' '\t' >>"$out/noise.tsv"
        fi
        wait "$job" || note "noise: the $size selfish job failed"
        sed -n "s/^detour \(.*\) \(.*\)/detour\t$size\t\1\t\2/p" "$scratch/noise.out" | tr ' ' '\t' >>"$out/noise.tsv"
        grep "^insitu-noise: [0-9]" "$scratch/noise.out" | sed "s/^insitu-noise: /summary\t$size\t/" >>"$out/noise.tsv"
    done
    remove_enclave "$dir" noise
}

scaling() {
    note "scaling: 1, 2, 4, 8 enclave/attacher pairs on $(nproc) cores"
    describe scaling
    : >"$out/scaling.tsv"
    local pairs p dir core owners attachers
    local cores
    cores=$(nproc)
    # One daemon gives a core to one enclave: pair p runs under daemon (p-1)/cores, on core (p-1)%cores.
    for d in 0 1 2 3; do start_daemon "$scratch/scaling-$d"; done
    for pairs in 1 2 4 8; do
        note "scaling: $pairs pairs"
        owners=()
        attachers=()
        for p in $(seq "$pairs"); do
            dir=$scratch/scaling-$(( (p - 1) / cores ))
            core=$(( (p - 1) % cores ))
            create_enclave "$dir" "pair$p" "$core" $(( pair_mib + 384 ))M
            start_owner "$dir" "pair$p" "pair-$$-$pairs-$p" "$pair_mib" 600 "$scratch/owner.$p"
            owners+=("$job")
        done
        for p in $(seq "$pairs"); do
            dir=$scratch/scaling-$(( (p - 1) / cores ))
            (on_daemon "$dir" "$apps/insitu-attach" "pair-$$-$pairs-$p" $(( pair_mib * 1024 )) "$pair_attaches" 0) \
                >"$scratch/attacher.$p" 2>&1 &
            attachers+=($!)
        done
        for p in $(seq "$pairs"); do
            if wait "${attachers[p - 1]}"; then
                sed -n "s/^insitu-attach: .* median \([0-9.]*\) us, \([0-9.]*\) GB\/s$/$pairs\t$p\t\1\t\2/p" "$scratch/attacher.$p" >>"$out/scaling.tsv"
            else
                printf '%s\t%s\tfailed\t%s\n' "$pairs" "$p" "$(tail -1 "$scratch/attacher.$p")" >>"$out/scaling.tsv"
            fi
        done
        for p in $(seq "$pairs"); do
            kill "${owners[p - 1]}" 2>/dev/null || true
            wait "${owners[p - 1]}" 2>/dev/null || true
            remove_enclave "$scratch/scaling-$(( (p - 1) / cores ))" "pair$p"
        done
    done
}

: >>"$out/machine.tsv"
for part in "${parts[@]}"; do
    # A part's new header replaces its old one.
    grep -v "^$part	" "$out/machine.tsv" >"$scratch/machine" || true
    cp "$scratch/machine" "$out/machine.tsv"
    "$part"
done
python3 bench/insitu/results.py "$out" >"$root/docs/results/insitu.md"
note "wrote docs/results/insitu.md and its figures"
