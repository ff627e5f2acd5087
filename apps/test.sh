#!/usr/bin/env bash
# The applications on the host (the same static binaries the LWK runs): each gives a verified
# result on a small input, selfish's `list` prints every detour it counted, and a malformed or
# out-of-range argument is named with status 2 before anything runs.
set -uo pipefail
cd "$(dirname "$0")"
make -s -C . >/dev/null || { echo "FAIL apps: build"; exit 1; }
bin=../build/apps
failures=0 cases=0
fail() { failures=$((failures + 1)); echo "FAIL $1"; }
# Lines "expected text|command" on stdin: each command, run in the build directory, must end
# with STATUS and say the text.
expect_each() { # STATUS
    local expected command output status
    while IFS='|' read -r expected command; do
        cases=$((cases + 1))
        output=$(cd "$bin" && timeout 60 bash -c "$command" 2>&1)
        status=$?
        [ $status = "$1" ] && grep -qF -- "$expected" <<<"$output" ||
            fail "$command: status $status, said: $(tail -2 <<<"$output")"
    done
}

# Small runs
expect_each 0 <<'RUNS'
stream: results verified|./stream 100000 3
hpccg: solution verified|./hpccg 12 12 12
minicg: solution verified|./minicg 12 12 12
minicg: solution verified|./minicg-wall-dyn 12 12 12
triad: results verified|./triad avx2 2 1024 100
syscall-loop: 1000 getpid calls|./syscall-loop 1000
detours, |./selfish 0.2
RUNS

# selfish's list: one "detour AT_US LENGTH_US" line per detour counted (up to 100,000).
cases=$((cases + 1))
output=$(timeout 30 "$bin/selfish" 0.3 1000 list)
counted=$(sed -n 's/^selfish: \([0-9]*\) detours, .*/\1/p' <<<"$output")
listed=$(grep -cE '^detour [0-9]+\.[0-9]{3} [0-9]+\.[0-9]{3}$' <<<"$output")
others=$(grep -vcE '^(selfish: |detour )' <<<"$output")
if [ -z "$counted" ] || [ "$listed" != "$((counted < 100000 ? counted : 100000))" ] || [ "$others" != 0 ]; then
    fail "selfish list: counted '$counted', listed $listed, $others other lines"
fi

# Bad arguments
expect_each 2 <<'CASES'
N must be an integer from 1000 to 4000000000, got "2e7"|./stream 2e7
REPEATS must be an integer from 2 to 1000, got "1"|./stream 100000 1
usage: stream|./stream 1000 2 3
NZ must be an integer from 1 to 1024, got "8x"|./hpccg 8 8 8x
TOLERANCE must be a number from 0 to 1, got "tight"|./hpccg 8 8 8 10 tight
NY must be an integer from 1 to 512, got "0"|./minicg 8 0 8
usage: minicg|./minicg-wall 8 8
usage: triad|./triad sse 1
N must be a multiple of 8, got 100|./triad avx2 1 100
ITERATIONS must be an integer from 1 to 1000000000000, got "1e6"|./syscall-loop 1e6
DURATION_S must be a number from 0.001 to 3600, got "5s"|./selfish 5s
THRESHOLD_NS must be an integer from 0 to 1000000000, got "abc"|./selfish 1 abc
usage: selfish|./selfish 1 0 lst
INTERVAL must be an integer from 1 to 40, got "50"|./insitu-sim xemem sync once seg 8 8 8 40 50
DATA_MB must be an integer from 0 to 512, got "1024"|./insitu-sim xemem sync recurring seg 8 8 8 40 10 1024
usage: insitu-sim|./insitu-sim xemem sync twice seg 8 8 8
LENGTH must be an integer from 1 to 2147483648, got "1M"|./insitu-analytics xemem once seg 1M
ROUNDS must be an integer from 1 to 1000, got "0"|./insitu-analytics files recurring /nonexistent 1000 0
KIB must be a multiple of 4|./insitu-attach seg 6 1 0
CASES

if [ $failures = 0 ]; then
    echo "ok   applications: small runs verified, selfish's detour list, bad arguments named ($cases cases)"
else
    echo "FAIL applications: $failures of $cases cases"
    exit 1
fi
