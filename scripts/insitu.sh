#!/usr/bin/env bash
# The in-situ composition of the XEMEM paper (section 6, Fig. 8) in small: a CG simulation
# (apps/insitu/sim.c) publishes its solution vector, repeated to the analytics' data size, every
# interval to a STREAM analytics process (apps/insitu/analytics.c).
#
#   scripts/insitu.sh [--check] [--config LIST] [--workflow LIST] [--data-mb MB] [--repeat N]
#                     [--isolate-cores] [--tsv FILE] [NX NY NZ [ITERATIONS [INTERVAL [ROUNDS]]]]
#
# Configurations (--config, comma-separated letters or names; default all):
#   a host-xemem  both on the host (sim on the last core, analytics on core 0), through libxpmem
#   b host-files  both on the host, through POSIX files
#   c lwk-host    the simulation in an LWK enclave (last core), the analytics on the host (core 0)
#   d lwk-lwk     the simulation and the analytics in two LWK enclaves (last core, core 0)
#   e lwk-linux   the simulation in an LWK enclave (last core), the analytics in a Linux-VM enclave
#                 (core 0; the project's guest kernel, scripts/linux-kernel.sh, built on first use:
#                 about 40 minutes, cached; the boot about 40 s)
# Workflows (--workflow, default all): sync-once, async-once, sync-recurring, async-recurring.
#   sync: the simulation waits for each interval's analysis; async: only for its copy.
#   once: one segment (file) attached once; recurring: a new region (file) every interval,
#   attached, read, detached, released and removed.
# --data-mb MB: the analytics' data, 0 (the vector alone, default) to 512 (the paper's).
# --repeat N runs every configuration x workflow N times. --tsv FILE appends one line per run:
#   config workflow run total_s compute_s publish_s wait_s data_mb status.
# --isolate-cores: the script's own clowderd runs with --isolate-cores (host tasks off the
#   enclaves' cores). --check: exit non-zero unless, in every run, the analytics saw each
#   interval's data exactly as the simulation published it (the simulation's checksums equal
#   the analytics', one per interval) and both sides succeeded.
# Uses a daemon already listening at $CLOWDER_SOCKET if set and live (not with --isolate-cores);
# otherwise starts its own. The benchmark and its results page: bench/insitu/run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
    [ -n "${1:-}" ] && echo "insitu: $1" >&2
    echo "usage: scripts/insitu.sh [--check] [--config a,b,c,d,e] [--workflow sync-once,...] [--data-mb MB] [--repeat N]" \
         "[--isolate-cores] [--tsv FILE] [NX NY NZ [ITERATIONS [INTERVAL [ROUNDS]]]]" >&2
    exit 2
}
# A whole number from 1 up, or the usage with what is wrong.
count() { # name value
    [[ $2 =~ ^[1-9][0-9]{0,8}$ ]] || usage "$1 must be a whole number from 1 up, not '$2'"
    echo "$2"
}
check=0
repeats=1
data_mb=0
isolate=
tsv=
configs=(host-xemem host-files lwk-host lwk-lwk lwk-linux)
workflows=(sync-once async-once sync-recurring async-recurring)
# The names of a comma-separated list, each checked against the known ones, into $configs or
# $workflows (in this shell: a usage error must end the script).
config_list() {
    local item out=() items
    IFS=, read -ra items <<<"$1"
    for item in "${items[@]}"; do
        case $item in
            a | host-xemem) out+=(host-xemem) ;; b | host-files) out+=(host-files) ;;
            c | lwk-host) out+=(lwk-host) ;; d | lwk-lwk) out+=(lwk-lwk) ;; e | lwk-linux) out+=(lwk-linux) ;;
            all) out+=("${configs[@]}") ;;
            *) usage "unknown configuration '$item' (a host-xemem, b host-files, c lwk-host, d lwk-lwk, e lwk-linux)" ;;
        esac
    done
    [ ${#out[@]} -gt 0 ] || usage "--config names no configuration"
    configs=("${out[@]}")
}
workflow_list() {
    local item out=() items
    IFS=, read -ra items <<<"$1"
    for item in "${items[@]}"; do
        case $item in
            sync-once | async-once | sync-recurring | async-recurring) out+=("$item") ;;
            all) out+=("${workflows[@]}") ;;
            *) usage "unknown workflow '$item' (sync-once, async-once, sync-recurring, async-recurring)" ;;
        esac
    done
    [ ${#out[@]} -gt 0 ] || usage "--workflow names no workflow"
    workflows=("${out[@]}")
}
while [ $# -gt 0 ]; do
    case "$1" in
        --check) check=1; shift ;;
        --repeat) [ $# -ge 2 ] || usage "--repeat needs a count"; repeats=$(count --repeat "$2"); shift 2 ;;
        --config) [ $# -ge 2 ] || usage "--config needs a list"; config_list "$2"; shift 2 ;;
        --workflow) [ $# -ge 2 ] || usage "--workflow needs a list"; workflow_list "$2"; shift 2 ;;
        --data-mb)
            [ $# -ge 2 ] || usage "--data-mb needs a size"
            [[ $2 =~ ^[0-9]{1,3}$ ]] && [ "$2" -le 512 ] || usage "--data-mb is a size in MiB from 0 to 512, not '$2'"
            data_mb=$2; shift 2 ;;
        --isolate-cores) isolate=--isolate-cores; shift ;;
        --tsv) [ $# -ge 2 ] || usage "--tsv needs a file"; tsv=$2; shift 2 ;;
        -h | --help) usage ;;
        -*) usage "unknown option '$1'" ;;
        *) break ;;
    esac
done
[ $# -le 6 ] || usage "at most six numbers"
nx=$(count NX "${1:-48}")
ny=$(count NY "${2:-48}")
nz=$(count NZ "${3:-48}")
grid=("$nx" "$ny" "$nz")
iterations=$(count ITERATIONS "${4:-600}")
interval=$(count INTERVAL "${5:-40}")
rounds=$(count ROUNDS "${6:-5}")
[ "$interval" -le "$iterations" ] || usage "INTERVAL ($interval) is longer than ITERATIONS ($iterations)"
vector_length=$(( grid[0] * grid[1] * grid[2] ))
data_length=$(( data_mb << 17 ))
length=$(( data_length > vector_length ? data_length : vector_length ))
intervals=$(( iterations / interval ))

if [ ! -e /dev/kvm ]; then
    echo "insitu: /dev/kvm is missing: enclaves need KVM" >&2
    exit 1
fi
make -s -C apps >/dev/null
bin=target/release
apps=build/apps
analytics_core=0
sim_core=$(( $(nproc) - 1 ))
# Enclave memory: the simulation holds the data (and, recurring, the interval's region beside
# its vector), the analytics three private arrays of it; 256 MiB for the rest. The LWK gives a
# job's heap about 3/4 of its free memory: the analytics' 3 arrays need 4 data sizes.
data_mib=$(( (length * 8 + (1 << 20) - 1) >> 20 ))
sim_mem=$(( 2 * data_mib + 256 ))M
analytics_mem=$(( 4 * data_mib + 256 ))M

state=$(mktemp -d /tmp/clowder-insitu.XXXXXX)
daemon=
enclaves=()
remove_enclave() { # NAME
    "$bin/clowder" enclave rm "$1" >/dev/null 2>&1 || true
    local left=() e
    for e in "${enclaves[@]}"; do [ "$e" = "$1" ] || left+=("$e"); done
    enclaves=("${left[@]}")
}
cleanup() {
    # Enclaves go even when the daemon is someone else's.
    for enclave in "${enclaves[@]}"; do "$bin/clowder" enclave rm "$enclave" >/dev/null 2>&1 || true; done
    if [ -n "$daemon" ]; then
        kill "$daemon" 2>/dev/null || true
        wait "$daemon" 2>/dev/null || true
    fi
    rm -rf "$state"
}
trap cleanup EXIT
if [ -n "$isolate" ] || [ -z "${CLOWDER_SOCKET:-}" ] || ! "$bin/clowder" enclave ls >/dev/null 2>&1; then
    export CLOWDER_SOCKET="$state/clowderd.sock"
    # Long pings: an LWK job mapping or unmapping hundreds of MiB keeps its (emulated) kernel busy.
    "$bin/clowderd" --vmm "$bin/clowder-vmm" --socket "$CLOWDER_SOCKET" --xemem-socket "$state/xemem.sock" --ping-timeout 120000 \
        $isolate >"$state/clowderd.log" 2>&1 &
    daemon=$!
    for _ in $(seq 200); do [ -S "$CLOWDER_SOCKET" ] && [ -S "$state/xemem.sock" ] && break; sleep 0.05; done
fi
# libxpmem finds the daemon's broker beside its socket.
export CLOWDER_XEMEM_SOCKET="$(dirname "$CLOWDER_SOCKET")/xemem.sock"
# Another daemon's --isolate-cores may hold a core off host tasks for a while (its tests here):
# the enclave waits for it up to a minute, a host process runs unpinned meanwhile.
create_enclave() { # NAME CORE MEMORY [KIND [ARGS...]] (KIND lwk by default)
    local attempt name=$1 core=$2 memory=$3 kind=${4:-lwk}
    shift $(( $# < 4 ? $# : 4 ))
    for attempt in $(seq 30); do
        if "$bin/clowder" enclave create --name "$name" --kind "$kind" --core-list "$core" --mem "$memory" "$@" >"$state/create.out" 2>&1; then
            enclaves+=("$name")
            return
        fi
        grep -q "not online or not allowed" "$state/create.out" || break
        sleep 2
    done
    cat "$state/create.out" >&2
    return 1
}
pin() { # CORE COMMAND...: execs
    local core=$1
    shift
    taskset -c "$core" true 2>/dev/null && exec taskset -c "$core" "$@"
    echo "insitu: core $core is not ours now (another daemon's --isolate-cores?): $(basename "$1") runs unpinned" >&2
    exec "$@"
}
# The analytics' Linux enclave: the project's guest kernel and agent, its memory at least the
# 512 MiB a guest boots in.
create_linux_enclave() { # NAME CORE MEMORY(M)
    local kernel initrd mib=${3%M}
    kernel=$(scripts/linux-kernel.sh) && initrd=$(scripts/linux-kernel.sh initramfs) || return 1
    create_enclave "$1" "$2" "$(( mib > 512 ? mib : 512 ))M" linux --kernel "$kernel" --initrd "$initrd"
}

echo "in-situ: CG ${grid[0]}x${grid[1]}x${grid[2]}, $iterations iterations, $intervals intervals of $interval;" \
     "analytics data $(( length * 8 / 1024 )) KiB ($([ "$length" -gt "$vector_length" ] && echo "the vector repeated" || echo "the vector")), copy + $rounds rounds of scale/add/triad per interval"
echo "simulation on core $sim_core, analytics on core $analytics_core; ${configs[*]} x ${workflows[*]}, $repeats run(s) each"

failures=0
runs=0
rows=()
run_one() { # CONFIG WORKFLOW RUN
    local config=$1 workflow=$2 run=$3 dir name transport sync attach
    sync=${workflow%-*}
    attach=${workflow#*-}
    # A fresh directory and segment name per run: nothing left by an earlier run is taken for this one's.
    dir=$(mktemp -d "$state/$config-$workflow.XXXXXX")
    name="insitu-$$-${dir##*.}"
    transport=$([ "$config" = host-files ] && echo files || echo xemem)
    local where=$name
    [ "$transport" = files ] && where=$dir
    local sim_args=("$transport" "$sync" "$attach" "$where" "${grid[@]}" "$iterations" "$interval" "$data_mb")
    local analytics_args=("$transport" "$attach" "$where" "$length" "$rounds")
    case $config in
        host-*) (pin "$sim_core" "$apps/insitu-sim-host" "${sim_args[@]}") >"$dir/sim.out" 2>&1 & ;;
        *) ( cd "$dir" && exec "$OLDPWD/$bin/clowder" run --enclave insitu-sim "$OLDPWD/$apps/insitu-sim" "${sim_args[@]}" ) \
               >"$dir/sim.out" 2>&1 & ;;
    esac
    local sim_pid=$! analytics_status=0 sim_status=0
    case $config in
        lwk-lwk) "$bin/clowder" run --enclave insitu-analytics "$apps/insitu-analytics-lwk" "${analytics_args[@]}" ;;
        # The host's glibc build, run in the guest from the host's files; libxpmem takes its PCI backend there.
        lwk-linux) "$bin/clowder" run --enclave insitu-analytics "$apps/insitu-analytics" "${analytics_args[@]}" ;;
        *) (pin "$analytics_core" "$apps/insitu-analytics" "${analytics_args[@]}") ;;
    esac >"$dir/analytics.out" 2>&1 || analytics_status=$?
    wait "$sim_pid" || sim_status=$?

    local total compute publish wait
    local totals='^insitu-sim: total \([0-9.]*\) s .*, compute \([0-9.]*\) s, publishing \([0-9.]*\) s, waiting for the analytics \([0-9.]*\) s$'
    total=$(sed -n "s/$totals/\\1/p" "$dir/sim.out")
    compute=$(sed -n "s/$totals/\\2/p" "$dir/sim.out")
    publish=$(sed -n "s/$totals/\\3/p" "$dir/sim.out")
    wait=$(sed -n "s/$totals/\\4/p" "$dir/sim.out")
    # The data check: the simulation's per-interval checksums, as the analytics computed them.
    local published seen verdict=verified
    published=$(sed -n 's/^insitu-sim: interval \([0-9]*\) iteration [0-9]* checksum \([0-9a-f]*\)$/\1 \2/p' "$dir/sim.out")
    seen=$(sed -n 's/^insitu-analytics: interval \([0-9]*\) iteration [0-9]* checksum \([0-9a-f]*\) (matches.*/\1 \2/p' "$dir/analytics.out")
    runs=$(( runs + 1 ))
    if [ "$sim_status" != 0 ] || [ "$analytics_status" != 0 ] || [ -z "$published" ] || [ "$published" != "$seen" ] \
        || [ "$(echo "$published" | wc -l)" != "$intervals" ] || [ -z "$total" ]; then
        verdict=FAILED
        failures=$(( failures + 1 ))
        echo "--- $config $workflow: simulation (status $sim_status) ---"; cat "$dir/sim.out"
        echo "--- $config $workflow: analytics (status $analytics_status) ---"; cat "$dir/analytics.out"
    fi
    # Recurring files mode removes each interval's file: none may be left.
    if [ "$transport" = files ] && ls "$dir"/insitu-data.*.bin >/dev/null 2>&1; then
        verdict=FAILED
        failures=$(( failures + 1 ))
        echo "--- $config $workflow: interval files left behind: $(ls "$dir") ---"
    fi
    printf '%-11s %-16s %3d  total %8s s  compute %8s s  publish %8s s  wait %8s s  %s (%d of %d checksums)\n' \
        "$config" "$workflow" "$run" "${total:-?}" "${compute:-?}" "${publish:-?}" "${wait:-?}" "$verdict" \
        "$(echo "$seen" | grep -c . || true)" "$intervals"
    if [ -n "$tsv" ]; then
        printf '%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n' "$config" "$workflow" "$run" "${total:-nan}" "${compute:-nan}" \
            "${publish:-nan}" "${wait:-nan}" "$data_mb" "$verdict" >>"$tsv"
    fi
    rm -rf "$dir"
}

for config in "${configs[@]}"; do
    case $config in
        lwk-host) create_enclave insitu-sim "$sim_core" "$sim_mem" ;;
        lwk-lwk) create_enclave insitu-sim "$sim_core" "$sim_mem"; create_enclave insitu-analytics "$analytics_core" "$analytics_mem" ;;
        lwk-linux) create_enclave insitu-sim "$sim_core" "$sim_mem"; create_linux_enclave insitu-analytics "$analytics_core" "$analytics_mem" ;;
    esac
    for run in $(seq "$repeats"); do
        for workflow in "${workflows[@]}"; do
            run_one "$config" "$workflow" "$run"
        done
    done
    remove_enclave insitu-sim
    remove_enclave insitu-analytics
done

if [ "$failures" != 0 ]; then
    echo "insitu: $failures of $runs runs FAILED" >&2
    exit 1
fi
if [ "$check" = 1 ]; then
    echo "insitu --check: $runs passed, 0 failed (every interval's checksum matched in every run)"
fi
