#!/usr/bin/env bash
# Builds DEX's libFuzzer targets and runs each for SECONDS from the seed
# corpus committed under fuzz/corpus/TARGET:
#   wire           the runtime's message decoder and the authentication's
#   agent_request  dexnode's start request parser
# Inputs that once crashed a target, committed under fuzz/regressions/TARGET,
# are replayed first. New inputs go to build/fuzz/corpus/TARGET (the
# committed seeds are only read); a crash leaves build/fuzz/crash-TARGET-*
# and fails the script (exit status 1). One summary line per target:
# executions and coverage.
# Needs clang with libFuzzer (Debian: clang, libclang-rt-14-dev; installed
# here when missing, as root).
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:-}
if ! [[ $seconds =~ ^[1-9][0-9]*$ ]]; then
	echo "usage: dex/fuzz/run.sh SECONDS (a whole number of seconds per target)" >&2
	exit 2
fi
CC=${FUZZ_CC:-clang}
have_libfuzzer() { echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { return 0; }' |
	"$CC" -x c -fsanitize=fuzzer -o /dev/null - 2>/dev/null; }
if ! command -v "$CC" >/dev/null || ! have_libfuzzer; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "fuzz: $CC with libFuzzer is missing; run as root or: sudo apt-get install -y clang libclang-rt-14-dev" >&2
		exit 1
	fi
	echo "fuzz: installing clang and libFuzzer" >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends clang libclang-rt-14-dev >/dev/null
fi
out=../build/fuzz
mkdir -p "$out"
flags=(-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -std=gnu11 -D_GNU_SOURCE)
"$CC" "${flags[@]}" -o "$out/wire" wire.c ../src/protocol.c ../src/auth.c -lnettle
"$CC" "${flags[@]}" -o "$out/agent_request" agent_request.c ../src/node_agent_request.c ../src/auth.c -lnettle

failed=0
for target in wire agent_request; do
	mkdir -p "$out/corpus/$target"
	log="$out/$target.log"
	if compgen -G "regressions/$target/*" >/dev/null &&
		! "$out/$target" -timeout=10 "regressions/$target"/* >"$log" 2>&1; then
		failed=1
		echo "fuzz $target: FAILED (a regression input crashes again: $(sed -n 's/^Running: //p' "$log" | tail -1))"
		continue
	fi
	if "$out/$target" -max_total_time="$seconds" -timeout=10 -print_final_stats=1 \
		-artifact_prefix="$out/crash-$target-" "$out/corpus/$target" "corpus/$target" >"$log" 2>&1; then
		execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
		cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
		echo "fuzz $target: ${execs:-?} executions in $seconds s, ${cov:-cov: ?} edges, no crash"
	else
		failed=1
		echo "fuzz $target: FAILED (crash input: $(ls "$out"/crash-"$target"-* 2>/dev/null | head -1))"
		grep -A12 -m1 'ERROR\|==ERROR\|runtime error' "$log" | sed 's/^/    /' || tail -20 "$log" | sed 's/^/    /'
	fi
done
exit $failed
