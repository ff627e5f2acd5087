#!/usr/bin/env bash
# Runs every fuzz target for a bounded time: the cargo-fuzz targets (a fuzz/ folder in each fuzzed package) and
# DEX's (dex/fuzz/run.sh, when it exists).
#
#   scripts/fuzz.sh [TARGET...]      TARGET: CRATE/NAME (clowderd/request), NAME, or dex
#   FUZZ_SECONDS=60                  time per target (make fuzz: 60; make test: 15)
#   FUZZ_OUT=target/fuzz/runs        logs and crashing inputs, kept after the run
#
# Each target first replays its regression inputs (PACKAGE/fuzz/regressions/NAME/), then
# fuzzes from its committed seed corpus (PACKAGE/fuzz/corpus/NAME/) into a scratch
# directory, so nothing it finds is written into the tree. A crash, leak, timeout or runaway
# allocation fails the run, and the script says where the input is and how to keep it as a
# regression input. Installs cargo-fuzz (and the nightly toolchain it needs) when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

usage="usage: scripts/fuzz.sh [CRATE/NAME | NAME | dex]...  (FUZZ_SECONDS per target, default 60)"
seconds=${FUZZ_SECONDS:-60}
if ! [[ $seconds =~ ^[1-9][0-9]*$ ]]; then
    echo "fuzz: FUZZ_SECONDS must be a whole number of seconds from 1 up, not '$seconds'" >&2
    exit 2
fi
for arg in "$@"; do
    case $arg in
        -h | --help) echo "$usage"; exit 0 ;;
        -*) echo "fuzz: unknown option '$arg'; $usage" >&2; exit 2 ;;
    esac
done
out=${FUZZ_OUT:-target/fuzz/runs}
build_dir=target/fuzz
binaries=$build_dir/x86_64-unknown-linux-gnu/release

if ! rustup toolchain list | grep -q '^nightly'; then
    echo "fuzz: installing the nightly Rust toolchain (cargo-fuzz needs it)"
    rustup toolchain install nightly --profile minimal >/dev/null
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz from crates.io"
    cargo install cargo-fuzz --locked --quiet
fi

# Every target as CRATE/NAME, and which were asked for.
all=()
# Each fuzz crate sits in the package it fuzzes; CRATE is that package's name.
declare -A fuzz_dir
for dir in crates/*/fuzz node/*/fuzz xemem/*/fuzz vmm/*/fuzz; do
    [ -f "$dir/Cargo.toml" ] || continue
    crate=$(sed -n 's/^name = "\(.*\)"$/\1/p' "$dir/../Cargo.toml" | head -1)
    fuzz_dir[$crate]=$dir
    for name in $(cargo +nightly fuzz list --fuzz-dir "$dir"); do
        all+=("$crate/$name")
    done
done
[ -x dex/fuzz/run.sh ] && all+=(dex)
chosen=()
for arg in "$@"; do
    found=
    for target in "${all[@]}"; do
        if [ "$arg" = "$target" ] || [ "$arg" = "${target#*/}" ]; then chosen+=("$target"); found=1; fi
    done
    if [ -z "$found" ]; then
        echo "fuzz: no target '$arg' (targets: ${all[*]})" >&2
        exit 2
    fi
done
[ ${#chosen[@]} -gt 0 ] || chosen=("${all[@]}")

start=$SECONDS
mkdir -p "$out"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# One build per fuzz crate, all in one target directory so shared crates build once. Debug
# assertions stay on (cargo-fuzz's default): an arithmetic overflow is a finding too.
built=" "
for target in "${chosen[@]}"; do
    crate=${target%%/*}
    [ "$target" = dex ] || [[ $built == *" $crate "* ]] && continue
    echo "fuzz: building ${fuzz_dir[$crate]}"
    cargo +nightly fuzz build --fuzz-dir "${fuzz_dir[$crate]}" --target-dir "$build_dir" 2>"$out/build-$crate.log" \
        || { tail -30 "$out/build-$crate.log"; echo "fuzz: building ${fuzz_dir[$crate]} failed (log: $out/build-$crate.log)"; exit 1; }
    built+="$crate "
done

# Tells why a target failed (the panic or sanitizer report, and the stack frames in our code),
# then each crashing input and how to replay it and keep it as a regression input.
report_crash() {
    local target=$1 binary=$2 log=$3 regressions=$4 input
    shift 4
    grep -A1 -E '^thread .* panicked' "$log" | head -4 || true
    grep -E '^(==[0-9]+==ERROR|SUMMARY:|ERROR: libFuzzer)' "$log" | head -4 || true
    grep -E "^ +#[0-9]+ .* $PWD/" "$log" | grep -v '/fuzz/target/\|libfuzzer-sys' | head -8 || true
    for input in "$@"; do
        [ -e "$input" ] || continue
        echo "fuzz: $target failed on $input"
        echo "      replay:  $binary $input"
        [[ $input == "$regressions"/* ]] || echo "      keep it: mkdir -p $regressions && cp $input $regressions/"
    done
    echo "      full log: $log"
}

# A summary table row from a libFuzzer log: its final stats and last status line
# ("#N DONE cov: C ft: F corp: K/SIZE ...").
row() {
    local target=$1 log=$2 result=$3 execs rate status cov ft corpus
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    status=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$status")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$status")
    corpus=$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<<"$status")
    echo "| $target | ${execs:-?} | ${rate:-?} | ${cov:-?} | ${ft:-?} | ${corpus:-?} | $result |"
}

failed=()
summary=()
for target in "${chosen[@]}"; do
    if [ "$target" = dex ]; then
        echo "fuzz: dex (dex/fuzz/run.sh $seconds)"
        if dex/fuzz/run.sh "$seconds" | tee "$out/dex.log"; then result=ok; else result=FAILED; failed+=(dex); fi
        # One line per target ("fuzz wire: ..."); each left its libFuzzer log in dex/build/fuzz.
        for name in $(sed -n 's/^fuzz \([a-z_]*\): .*/\1/p' "$out/dex.log"); do
            summary+=("$(row "dex/$name" "dex/build/fuzz/$name.log" "$result")")
        done
        continue
    fi
    crate=${target%%/*} name=${target#*/}
    binary=$binaries/$name
    seeds=${fuzz_dir[$crate]}/corpus/$name
    regressions=${fuzz_dir[$crate]}/regressions/$name
    artifacts=$out/$crate-$name
    log=$out/$crate-$name.log
    rm -rf "$artifacts"
    mkdir -p "$artifacts" "$scratch/$crate-$name"
    # A regression input is run once, alone, before any fuzzing.
    if compgen -G "$regressions/*" >/dev/null; then
        if ! "$binary" -timeout=10 -artifact_prefix="$artifacts/" "$regressions"/* >"$log" 2>&1; then
            echo "fuzz: $target: a regression input fails again"
            # libFuzzer names each input as it runs it: the last one named failed.
            report_crash "$target" "$binary" "$log" "$regressions" "$(sed -n 's/^Running: //p' "$log" | tail -1)"
            failed+=("$target"); summary+=("| $target | | | | | | regression FAILED |")
            continue
        fi
    fi
    read_only=("$seeds")
    [ -d "$regressions" ] && read_only+=("$regressions")
    echo "fuzz: $target for ${seconds} s"
    # New inputs go to the first (scratch) directory only; the committed ones are only read.
    if "$binary" "$scratch/$crate-$name" "${read_only[@]}" -max_total_time="$seconds" -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$artifacts/" >"$log" 2>&1; then
        result=ok
    else
        result=FAILED
        failed+=("$target")
        report_crash "$target" "$binary" "$log" "$regressions" \
            "$artifacts"/crash-* "$artifacts"/leak-* "$artifacts"/timeout-* "$artifacts"/oom-*
    fi
    summary+=("$(row "$target" "$log" "$result")")
done

echo
echo "| target | execs | exec/s | cov | ft | corpus | result |"
echo "|---|---:|---:|---:|---:|---:|---|"
printf '%s\n' "${summary[@]}"
echo
echo "fuzz: ${#summary[@]} targets, ${seconds} s each, $((SECONDS - start)) s in all (logs: $out)"
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: FAILED: ${failed[*]}"
    exit 1
fi
