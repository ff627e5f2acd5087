#!/usr/bin/env bash
# Builds and runs every DEX test. Exit status is non-zero if any fails; the
# last line is "N passed, N failed". Set DEX_SOAK=N to repeat the
# application runs N times each (the issue's soak test uses 50).
set -u
cd "$(dirname "$0")"
BUILD=build
passed=0
failed=0
LOG=$(mktemp -d)
trap 'rm -rf "$LOG"' EXIT

pass() { passed=$((passed + 1)); echo "PASS $1"; }
fail() { failed=$((failed + 1)); echo "FAIL $1"; [ -n "${2:-}" ] && sed 's/^/    /' "$2" | tail -20; }

# Runs a command with a deadline; records output in $LOG/out.
run() { timeout 120 "$@" >"$LOG/out" 2>&1; }

check_output() { # name expected-pattern command...
	local name=$1 pattern=$2
	shift 2
	if run "$@" && grep -q -- "$pattern" "$LOG/out"; then pass "$name"; else fail "$name" "$LOG/out"; fi
}

check_status() { # name seconds command...: passes if the command succeeds within that many seconds
	local name=$1 seconds=$2
	shift 2
	if timeout "$seconds" "$@" >"$LOG/out" 2>&1; then pass "$name"; else fail "$name" "$LOG/out"; fi
}

leftovers() { # processes still running the given marker argument
	pgrep -f -- "$1" | grep -v "^$$\$" || true
}

# A 3-node pingpong run in the background, found by the marker $1 on its
# command line: start_marked sets $runner (dexrun) and gives the nodes 1.5 s
# to start; signal_node marker node signal sets $victim and signals it;
# end_marked waits for dexrun, sets $rc, $ended (when dexrun ended) and
# $left (what still runs 0.2 s later) and kills those.
start_marked() {
	$DEXRUN -n 3 "$BUILD/coherence" pingpong 2 "$1" >"$LOG/out" 2>&1 &
	runner=$!
	sleep 1.5
}
signal_node() {
	local p
	victim=""
	for p in $(pgrep -f -- "$1"); do
		if tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -q "DEX_BOOT=node=00$2"; then victim=$p; fi
	done
	[ -z "$victim" ] || kill -"$3" "$victim"
}
end_marked() {
	wait $runner
	rc=$?
	ended=$(date +%s.%N)
	sleep 0.2
	left=$(leftovers "$1")
	[ -z "$left" ] || kill -KILL $left
}

echo "building..."
if ! make -s >"$LOG/build" 2>&1; then
	fail "build" "$LOG/build"
	echo "$passed passed, $failed failed"
	exit 1
fi
DEXRUN="$BUILD/dexrun --timeout 100"

# 1. pure protocol: unit tests and random interleavings
check_output "protocol: directory, fault coalescing, wire validation" "0 failures" "$BUILD/test_protocol"

# 2. launcher + DSM + migration: a thread visits every node
for n in 1 2 3 4; do
	check_output "hello_nodes on $n node(s): globals, heap and stack follow the thread" "back on node 0" \
		$DEXRUN -n $n "$BUILD/hello_nodes"
done

# dexrun's and dexnode's command lines: each mistake is named, with status 2
printf 'localhost:http\n' >"$LOG/hosts"
printf '127.0.0.1\n' >"$LOG/hosts_ok"
od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$LOG/secret"
printf '0123abcd\n' >"$LOG/short_secret"
cp "$LOG/secret" "$LOG/open_secret"
chmod 600 "$LOG/secret" "$LOG/short_secret"
chmod 644 "$LOG/open_secret"
mistakes=0
while IFS='|' read -r program expected args; do
	# shellcheck disable=SC2086 # the arguments are words on purpose
	timeout 10 "$BUILD/$program" $args >"$LOG/out" 2>&1
	status=$?
	if [ $status != 2 ] || ! grep -qF -- "$expected" "$LOG/out"; then
		mistakes=$((mistakes + 1))
		echo "    $program $args: status $status, $(head -1 "$LOG/out")"
	fi
done <<CASES
dexrun|-n takes a node count from 1 to 32, not '0'|-n 0 /bin/true
dexrun|-n takes a node count from 1 to 32, not '33'|-n 33 /bin/true
dexrun|-n takes a node count from 1 to 32, not '2x'|-n 2x /bin/true
dexrun|no program to run|-n 2
dexrun|say how many nodes with -n N, or give --hosts FILE|/bin/true
dexrun|unknown option (or one missing its value): '--frob'|--frob /bin/true
dexrun|--timeout takes seconds (0: none), not 'soon'|-n 2 --timeout soon /bin/true
dexrun|unknown transport 'carrier-pigeon'|-n 2 --transport carrier-pigeon /bin/true
dexrun|port 'http' of host localhost is not a number from 1 to 65535|--hosts $LOG/hosts /bin/true
dexrun|--secret-file is for --hosts through dexnode agents|-n 2 --secret-file $LOG/secret /bin/true
dexrun|secret file $LOG/open_secret: group or others may access it (chmod 600)|--hosts $LOG/hosts_ok --secret-file $LOG/open_secret /bin/true
dexnode|port 'abc' is not a number from 1 to 65535|--secret-file $LOG/secret --listen 127.0.0.1:abc
dexnode|unknown option (or one missing its value): '--frob'|--frob
dexnode|dexnode: error: no secret: give --secret-file FILE|
dexnode|secret file $LOG/short_secret: a secret is 64 hex digits|--secret-file $LOG/short_secret
dexnode|secret file $LOG/open_secret: group or others may access it (chmod 600)|--secret-file $LOG/open_secret
dexnode|secret file $LOG/none: no such file|--secret-file $LOG/none
CASES
# --version and --help answer on stdout, status 0 (help2man reads them), with src/version.h's release
release=$(sed -n 's/^#define DEX_RELEASE "\(.*\)"$/\1/p' src/version.h)
for path in "$BUILD/dexrun" "$BUILD/dexnode" bin/dexcc; do
	program=${path##*/}
	if ! "$path" --version 2>&1 | grep -qxF "$program (clowder DEX) $release" ||
		! "$path" --help 2>/dev/null | grep -q "^usage: $program "; then
		mistakes=$((mistakes + 1))
		echo "    $program --version / --help: $("$path" --version 2>&1 | head -1)"
	fi
done
if [ $mistakes = 0 ]; then
	pass "dexrun and dexnode name each command-line mistake, refuse to run without a proper secret (17 cases); they and dexcc answer --version ($release) and --help"
else
	fail "command-line mistakes ($mistakes not named)"
fi

# libdex's ABI: soname libdex.so.0, and only the public API exported
check_status "libdex.so.0: soname, and nm -D lists only dex.h/migrate.h, replaced libc calls and the UCX module's" 60 \
	tests/exports.sh "$BUILD"

# CLOWDER_LOG chooses which diagnostics libdex, dexrun and dexnode print
log_levels() {
	local bad=0 boot="node=000,nodes=001,port=00001,fd=-001,host=127.000.000.001"
	expect() { # description status-of-grep...
		[ "$2" = 0 ] || { echo "    $1"; sed 's/^/      /' "$LOG/out" | tail -5; bad=1; }
	}
	CLOWDER_LOG=debug $DEXRUN -n 2 "$BUILD/hello_nodes" >"$LOG/out" 2>&1
	grep -q 'dex\[node 0\]: debug: node 1 joined' "$LOG/out" && grep -q 'dex\[node 1\]: debug: joined the origin' "$LOG/out"
	expect "CLOWDER_LOG=debug: no join lines" $?
	CLOWDER_LOG=clowderd=trace,dex=debug $DEXRUN -n 2 "$BUILD/hello_nodes" >"$LOG/out" 2>&1
	grep -q 'dex\[node 1\]: debug: joined the origin' "$LOG/out"
	expect "CLOWDER_LOG=clowderd=trace,dex=debug: no join lines" $?
	CLOWDER_LOG=dex=debug,warn $DEXRUN -n 2 "$BUILD/hello_nodes" >"$LOG/out" 2>&1
	grep -q 'dex\[node 1\]: debug: joined the origin' "$LOG/out"
	expect "CLOWDER_LOG=dex=debug,warn: dex=debug did not outrank the later bare level" $?
	DEX_STATS=1 $DEXRUN -n 2 "$BUILD/hello_nodes" >"$LOG/out" 2>&1
	grep -q 'back on node 0' "$LOG/out" && ! grep -q ': debug: ' "$LOG/out" && grep -q 'dex\[node 1\]: stats:' "$LOG/out"
	expect "default (warn): debug lines shown, or DEX_STATS' lines missing" $?
	DEX_STATS=1 CLOWDER_LOG=error $DEXRUN -n 2 "$BUILD/hello_nodes" >"$LOG/out" 2>&1
	grep -q 'back on node 0' "$LOG/out" && ! grep -q 'stats:' "$LOG/out"
	expect "CLOWDER_LOG=error: warn-level lines shown" $?
	CLOWDER_LOG=loud $DEXRUN -n 2 "$BUILD/hello_nodes" >"$LOG/out" 2>&1
	[ $? = 2 ] && grep -q "dexrun: error: CLOWDER_LOG takes error, warn, info, debug or trace.*not 'loud'" "$LOG/out"
	expect "dexrun with CLOWDER_LOG=loud: not refused with status 2" $?
	CLOWDER_LOG=loud DEX_BOOT=$boot "$BUILD/hello_nodes" >"$LOG/out" 2>&1
	[ $? = 70 ] && grep -q "dex\[node 0\]: error: CLOWDER_LOG takes .*not 'loud'" "$LOG/out"
	expect "libdex with CLOWDER_LOG=loud: not stopped with status 70" $?
	return $bad
}
if log_levels >"$LOG/levels" 2>&1; then
	pass "CLOWDER_LOG: debug shows the joins, warn (default) hides them, error hides warnings, bad values named"
else
	fail "CLOWDER_LOG levels" "$LOG/levels"
fi

check_status "nodes launched by hand with ASLR on re-execute with it off and run" \
	60 python3 tests/manual_launch.py "$BUILD/hello_nodes"

# nodes in their own network namespaces, joined by veth pairs (root only)
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null && command -v nsenter >/dev/null; then
	$DEXRUN -n 3 --netns "$BUILD/coherence" mutex 6 500 >"$LOG/out" 2>&1 &
	runner=$!
	wait $runner
	rc=$?
	gone=0
	for _ in $(seq 50); do
		ip -o link | grep -q "dx${runner}[hn]" || { gone=1; break; }
		sleep 0.1
	done
	if [ $rc = 0 ] && grep -q "PASS mutex" "$LOG/out" && [ $gone = 1 ] &&
		$DEXRUN -n 3 --netns "$BUILD/netns_probe" 2>&1 | grep -q "3 distinct for 3 nodes"; then
		pass "--netns: 3 nodes in 3 network namespaces over veth, mutex counter right, veths gone after"
	else
		fail "--netns (rc $rc, veths gone $gone)" "$LOG/out"
	fi
else
	echo "SKIP --netns (needs root, ip and nsenter)"
fi

# An origin whose pid is 32767: the upper half of a thread descriptor's own address (0x7fff) then
# equals its thread id too, and libdex once took that word for glibc's tid field, so no exiting
# thread cleared its tid and pthread_join waited for ever (a CI timeout of the mutex case). The
# pid is set in a pid namespace of its own: ns_last_pid 32765, dexrun 32766, the origin (its first
# child) 32767; `; exit` keeps the shell from exec'ing dexrun as pid 1 (a node then leaves).
if [ "$(id -u)" = 0 ] && unshare --pid --fork --mount-proc true 2>/dev/null; then
	origin_pid_32767() { # dexrun arguments...
		unshare --pid --fork --mount-proc sh -c 'echo 32765 >/proc/sys/kernel/ns_last_pid && "$@"; exit $?' sh \
			"$BUILD/dexrun" --timeout 20 "$@"
	}
	if origin_pid_32767 -n 2 "$BUILD/coherence" mutex 6 1000 >"$LOG/out" 2>&1 && grep -q "PASS mutex" "$LOG/out" &&
		origin_pid_32767 -n 2 "$BUILD/popcorn_compat" >>"$LOG/out" 2>&1 && grep -q "PASS popcorn" "$LOG/out"; then
		pass "an origin whose pid is 32767 joins its threads (mutex counter) and keeps popcorn_gettid across nodes"
	else
		fail "origin with pid 32767" "$LOG/out"
	fi
else
	echo "SKIP origin with pid 32767 (needs root and unshare --pid)"
fi

# --hosts: nodes on two namespaced "hosts" through ssh and through dexnode agents (root only)
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null && command -v unshare >/dev/null; then
	check_status "--hosts: 2 namespaced hosts via ssh (tcp, ucx; secret on no command line; Ctrl-C) and via dexnode agents (tcp, ucx), differing binary refused, Ctrl-C reaches them, wrong secret refused" \
		150 bash tests/hosts_netns.sh "$BUILD"
else
	echo "SKIP --hosts (needs root, ip and unshare)"
fi

# a PMIx launcher (Open MPI's mpirun) starts the nodes: ranks find the origin through PMIx
if command -v mpirun >/dev/null && [ -f "$BUILD/libdex-pmix.so" ]; then
	check_status "mpirun: 2 and 3 ranks (tcp, ucx) find the origin through PMIx; no secret or another secret cannot join" \
		300 bash tests/pmix_mpirun.sh "$BUILD"
else
	echo "SKIP mpirun (needs openmpi-bin and libpmix-dev)"
fi

# Slurm starts the nodes: srun -N 2 --mpi=pmix, a slurmd in each of two network namespaces (root only)
if [ "$(id -u)" = 0 ] && [ -f "$BUILD/libdex-pmix.so" ] && command -v slurmctld >/dev/null && command -v slurmd >/dev/null &&
	command -v srun >/dev/null && command -v munged >/dev/null; then
	check_status "srun -N 2 --mpi=pmix: 2 nodes in 2 network namespaces find the origin through Slurm's PMIx; no secret, no start" \
		300 bash tests/slurm_netns.sh "$BUILD"
else
	echo "SKIP srun (needs root, libpmix-dev, slurmctld, slurmd, slurm-client and munge)"
fi

# no open agent: dexnode and a run's origin refuse whoever lacks the secret
if timeout 120 python3 tests/no_open_agent.py "$BUILD" >"$LOG/out" 2>&1; then
	pass "no open agent: dexnode on loopback, refuses missing/wrong secrets, caps and times out strangers; a run's origin and nodes refuse them too ($(grep -c '^ok' "$LOG/out") checks)"
else
	fail "no open agent" "$LOG/out"
fi

check_status "a node with a different address-space layout is refused at HELLO; both sides say why" \
	60 python3 tests/layout_mismatch.py "$BUILD/hello_nodes" "$BUILD/coherence"

# 3. exit status and output come from the origin, even when exit() runs on a node
run $DEXRUN -n 3 "$BUILD/exit_status" 7
rc=$?
if [ $rc -eq 7 ] && grep -q "origin line before" "$LOG/out" && grep -q "exiting with 7 from node 2" "$LOG/out"; then
	pass "exit status 7 from exit() on node 2, output of both nodes kept"
else
	fail "exit status from a node (rc $rc)" "$LOG/out"
fi

# 4. coherence across nodes ($via names the transport in the test names)
via=""
coherence_tests() {
for n in 2 3; do
	check_output "mutex counter, 6 threads on $n nodes$via" "PASS mutex" $DEXRUN -n $n "$BUILD/coherence" mutex 6 1000
	check_output "barrier phases, 4 threads on $n nodes$via" "PASS barrier" $DEXRUN -n $n "$BUILD/coherence" barrier 4 200
	check_output "condition variable queue on $n nodes$via" "PASS condvar" $DEXRUN -n $n "$BUILD/coherence" condvar 2 2000
	check_output "one page written alternately from 2 nodes ($n nodes)$via" "PASS pingpong" \
		$DEXRUN -n $n "$BUILD/coherence" pingpong 2 2000
	check_output "stack read by others while its thread migrates ($n nodes)$via" "PASS stackread" \
		$DEXRUN -n $n "$BUILD/coherence" stackread 4 300
	check_output "stack top written on node 1, carried home, rewritten, read on node $((n - 1)) ($n nodes)$via" \
		"PASS stackhome" $DEXRUN -n $n "$BUILD/coherence" stackhome 1 300
	check_output "threads' own CPU masks unchanged by their returns ($n nodes)$via" "PASS affinity" \
		$DEXRUN -n $n "$BUILD/coherence" affinity 3 300
	check_output "file I/O from a node; read() at the origin into a page a node holds ($n nodes)$via" "PASS fileio" \
		$DEXRUN -n $n "$BUILD/coherence" fileio
	check_output "anonymous mmap on a node is shared memory ($n nodes)$via" "PASS mmap" $DEXRUN -n $n "$BUILD/coherence" mmap
done
# layout changes run at the origin; shrinking is broadcast, growth learnt on demand
check_output "mmap on node 1, read on node 2, mremap there$via" "PASS mapmove" $DEXRUN -n 3 "$BUILD/coherence" mapmove
check_output "munmap on node 2: SIGSEGV on node 1 and the origin$via" "PASS unmap" $DEXRUN -n 3 "$BUILD/coherence" unmap
check_output "mprotect read-only at the origin: a write on node 1 faults$via" "PASS protect" \
	$DEXRUN -n 3 "$BUILD/coherence" protect
check_output "brk grown on node 1, shrunk on node 2, regrown zeroed$via" "PASS brk" $DEXRUN -n 3 "$BUILD/coherence" brk
}
coherence_tests
check_output "3000 short-lived migrating threads (ids, runtime blocks, stacks recycled)" "PASS churn" \
	$DEXRUN -n 3 "$BUILD/thread_churn" 3000 8
check_output "OpenMP parallel region spread over 3 nodes (libgomp threads migrate)" "PASS openmp" \
	$DEXRUN -n 3 "$BUILD/openmp_region"
check_output "Popcorn API: migrate() with callback, node info, error codes, tid" "PASS popcorn" \
	$DEXRUN -n 2 "$BUILD/popcorn_compat"

# concurrent faults on one page are coalesced (leader/follower): 4 threads on
# node 1 read the same 256 pages together; at most one request per page
rm -f "$LOG"/coalesce.*
if DEX_TRACE="$LOG/coalesce" run $DEXRUN -n 2 "$BUILD/coherence" coalesce 4 && grep -q "PASS coalesce" "$LOG/out"; then
	leaders=$(grep -c ' R ' "$LOG/coalesce.1")
	followers=$(grep -c ' r ' "$LOG/coalesce.1")
	if [ "$leaders" -le 280 ] && [ "$followers" -gt 0 ]; then
		pass "concurrent faults coalesced: $leaders requests, $followers faults served by them (256 pages x 4 threads)"
	else
		fail "coalescing: $leaders requests, $followers coalesced" "$LOG/out"
	fi
else
	fail "coalesce run" "$LOG/out"
fi

# profiler: the naive k-means trace names its source lines and the false
# sharing between its global flag and the barrier
rm -f "$LOG"/trace.*
if DEX_TRACE="$LOG/trace" run $DEXRUN -n 2 "$BUILD/kmeans" --naive 2 20000 8 4 &&
	tools/dex-prof report "$LOG/trace" >"$LOG/report" 2>&1 &&
	grep -q "kmeans.c:" "$LOG/report" && sed -n '/false sharing/,$p' "$LOG/report" | grep -q "changed_flag"; then
	pass "DEX_TRACE + dex-prof report: source lines and false sharing (changed_flag) in naive k-means"
else
	fail "profiler" "$LOG/report"
fi

# ... and a file that is no trace is named with what is wrong, not a traceback
printf 'garbage\n' >"$LOG/bad.0"
head -c 64 /dev/urandom >"$LOG/binary.0"
printf '1 0 0 R 401000 7f0000001000 5 0\n' >"$LOG/headless.0"
if ! tools/dex-prof report "$LOG/bad" >"$LOG/out" 2>&1 && grep -q "bad.0:1 is not a DEX trace line" "$LOG/out" &&
	! tools/dex-prof report "$LOG/binary" >>"$LOG/out" 2>&1 && grep -q "binary.0 is not a DEX trace (not text)" "$LOG/out" &&
	! tools/dex-prof report "$LOG/headless" >>"$LOG/out" 2>&1 && grep -q "no '# dex-trace' header line" "$LOG/out" &&
	! tools/dex-prof report "$LOG/trace" --top x >>"$LOG/out" 2>&1 && grep -q -- "--top takes a count" "$LOG/out" &&
	! grep -q Traceback "$LOG/out"; then
	pass "dex-prof names malformed traces and bad options"
else
	fail "dex-prof on malformed input" "$LOG/out"
fi

# fewer round trips: readahead on the node (k-means inputs) and at the origin
# (its final pass over what node 1 wrote), and a thread going home carrying
# its stack top (the origin then does not fault on it)
stat_field() { # file node field-suffix -> the number before it on that node's stats line
	grep "dex\[node $2\]: stats: faults" "$1" | grep -o "[0-9]* $3" | head -1 | cut -d' ' -f1
}
if DEX_STATS=1 run $DEXRUN -n 2 "$BUILD/kmeans" 2 400000 8 2; then
	r1=$(stat_field "$LOG/out" 1 read)
	p1=$(stat_field "$LOG/out" 1 "pages received")
	r0=$(stat_field "$LOG/out" 0 read)
	p0=$(stat_field "$LOG/out" 0 "pages received")
	m1=$(grep "dex\[node 1\]: stats: readahead:" "$LOG/out" | grep -o "[0-9]* next windows" | cut -d' ' -f1)
	if [ $((r1 * 4)) -lt "$p1" ] && [ $((r0 * 4)) -lt "$p0" ] && [ "${m1:-0}" -gt 0 ]; then
		pass "readahead: node 1 read-faulted $r1 times for $p1 pages ($m1 windows asked for at markers), the origin $r0 times for $p0"
	else
		fail "readahead: node 1 $r1 read faults for $p1 pages (${m1:-no} windows at markers), origin $r0 for $p0" "$LOG/out"
	fi
else
	fail "readahead run" "$LOG/out"
fi
# pthread barriers run at the origin: node 1's k-means thread no longer
# takes the barrier's page at every round (about 77 write requests in 20
# iterations before, 37 after)
if DEX_STATS=1 run $DEXRUN -n 2 "$BUILD/kmeans" 2 400000 8 20 && w1=$(stat_field "$LOG/out" 1 write) &&
	[ -n "$w1" ] && [ "$w1" -le 55 ]; then
	pass "barriers run at the origin: node 1 made $w1 write requests in 20 k-means iterations"
else
	fail "barrier at the origin (node 1 write requests: ${w1:-?})" "$LOG/out"
fi
if DEX_STATS=1 run $DEXRUN -n 2 "$BUILD/migration_latency" 200 && w0=$(stat_field "$LOG/out" 0 write) &&
	[ -n "$w0" ] && [ "$w0" -le 5 ]; then
	pass "a thread going home carries its stack top: $w0 write faults at the origin in 201 returns"
else
	fail "stack top carried home (origin write faults: ${w0:-?})" "$LOG/out"
fi

# a page granted to a faulting thread is held until the thread has used it:
# two threads taking 2000 turns on one page make about one write fault per
# turn each (2000-2008), where without the hold the page went back and forth
# between grant and use (2650-4100 per node here; up to 100,000 in the fault
# benchmark's ping-pong with Linux's halt polling). The hold is 20 ms here, not
# the default 500 us: a loaded CI machine wakes a thread later than 500 us
# (2734 and 3198 faults at a load of 14), which tests the scheduler, not the hold.
grant_hold_check() { # via
	local w0 w1
	if DEX_STATS=1 DEX_GRANT_HOLD_US=20000 run $DEXRUN -n 2 "$BUILD/coherence" pingpong 2 2000 && w0=$(stat_field "$LOG/out" 0 write) &&
		w1=$(stat_field "$LOG/out" 1 write) && [ -n "$w0" ] && [ -n "$w1" ] && [ "$w0" -le 2400 ] &&
		[ "$w1" -le 2400 ]; then
		pass "a granted page is used before it is taken back: $w0 and $w1 write faults in 2000 turns each$1"
	else
		fail "grant hold (write faults: ${w0:-?} and ${w1:-?} in 2000 turns each)$1" "$LOG/out"
	fi
}
grant_hold_check ""

# 5. applications: same answer without DEX and on 1, 2, 3 nodes
# The port, as in DEX's Table I: two dex_migrate lines per application (README, "Applications")
port_ok=1
for app in grp kmeans ep blk; do
	marked=$(grep -c 'dex_migrate(.*DEX port' "apps/$app.c")
	calls=$(grep -c 'dex_migrate(' "apps/$app.c")
	if [ "$marked" != 2 ] || [ "$calls" != 2 ]; then
		port_ok=0
		echo "    apps/$app.c: $calls dex_migrate calls, $marked marked 'DEX port'"
	fi
done
if [ $port_ok = 1 ]; then pass "each application's port is its two dex_migrate lines (DEX Table I: +2)"; else fail "application ports"; fi
soak=${DEX_SOAK:-1}
app_runs() { # name args...
	local name=$1
	shift
	local reference
	reference=$("$BUILD/$name" "$@" 2>&1)
	local ok=1 n i
	for i in $(seq "$soak"); do
		for n in 1 2 3; do
			if ! run $DEXRUN -n $n "$BUILD/$name" "$@" || [ "$(cat "$LOG/out")" != "$reference" ]; then
				ok=0
				echo "    run $i on $n nodes differs: $(head -c 300 "$LOG/out")"
				echo "    reference: $reference"
				break 2
			fi
		done
	done
	if [ $ok = 1 ]; then pass "$name $* : same result as plain run on 1/2/3 nodes (x$soak)$via"; else fail "$name $*"; fi
}
all_app_runs() {
	app_runs ep 4 20
	app_runs ep --naive 4 18
	app_runs kmeans 4 60000 8 6
	app_runs kmeans --naive 4 20000 8 4
	app_runs grp 4 4
	app_runs grp --naive 4 1
	app_runs blk 4 65536 2
	app_runs blk --naive 4 16384 1
}
all_app_runs

# 6. failure: kill a node mid-run
# Kills node 2 of a 3-node run (found by marker $1 on its command line) and checks that the run
# fails, says so, and leaves no process behind within 5 s; $2 names the transport in the
# result; any further arguments are lines the output must have too.
killed_node_check() {
	local mark=$1 via=$2 line said=1 start elapsed
	shift 2
	start_marked "$mark"
	start=$(date +%s.%N)
	signal_node "$mark" 2 KILL
	end_marked "$mark"
	elapsed=$(echo "$ended - $start" | bc)
	for line in "$@"; do grep -qF -- "$line" "$LOG/out" || said=0; done
	if [ -n "$victim" ] && [ $rc -ne 0 ] && grep -Eq "node 2 disconnected|connection to node 2 broken" "$LOG/out" &&
		[ $said = 1 ] && [ -z "$left" ] && [ "$(echo "$elapsed < 5" | bc)" = 1 ]; then
		pass "killed node$via: every node reports it, all gone in ${elapsed%??????} s (rc $rc)"
	else
		fail "killed node$via (victim '$victim', rc $rc, ${elapsed} s, leftover '$left')" "$LOG/out"
	fi
}
killed_node_check 424242421 "" "node 2 was killed by signal 9" "dex[node 1]: error: lost connection"

# a killed origin: every node reports it and leaves
start_marked 424242424
signal_node 424242424 0 KILL
end_marked 424242424
if [ -n "$victim" ] && [ $rc -eq 137 ] && [ "$(grep -c 'lost connection to the origin' "$LOG/out")" -eq 2 ] && [ -z "$left" ]; then
	pass "killed origin: both nodes report the lost origin, status 137, no process left"
else
	fail "killed origin (rc $rc, leftover '$left')" "$LOG/out"
fi

# a node or the origin that stops answering (SIGSTOP) is noticed by the
# heartbeat: its peers report the silence and everything ends
stop_test() { # node-to-stop expected-message
	local which=$1 expect=$2 mark=42424242$((5 + $1))
	DEX_PEER_TIMEOUT=3 start_marked $mark
	signal_node $mark "$which" STOP
	end_marked $mark
	if [ -n "$victim" ] && [ $rc -ne 0 ] && grep -q "$expect" "$LOG/out" && [ -z "$left" ]; then
		pass "stopped node $which$via: '$expect' reported, all ended (rc $rc), no process left"
	else
		fail "stopped node $which$via (rc $rc, leftover '$left')" "$LOG/out"
	fi
}
stop_test 1 "node 1 sent nothing for 3 s"
stop_test 0 "the origin sent nothing for 3 s"

# 7. Ctrl-C on dexrun ends every node
start_marked 424242422
kill -INT $runner
end_marked 424242422
if [ $rc -eq 130 ] && [ -z "$left" ]; then
	pass "Ctrl-C ends all nodes (rc 130, no process left)"
else
	fail "Ctrl-C (rc $rc, leftover '$left')" "$LOG/out"
fi

# 8. malformed and unexpected messages are rejected
check_status "malformed HELLO and out-of-range PAGE_REQUEST rejected, all processes stop" \
	60 python3 tests/malformed_peer.py "$BUILD/coherence"

# 8b. receivers (and UCX pumps) that poll rather than sleep, and threads that
# yield while their grant comes (DEX_POLL_US): the same protocol with another
# timing; silence is still noticed. The caller's own DEX_POLL_US, which the
# other sections run with, is put back after.
caller_poll_us=${DEX_POLL_US-} caller_polls=${DEX_POLL_US+set}
polling_checks() { # via
	local outer_via=$via
	export DEX_POLL_US=500
	via=$1
	coherence_tests
	stop_test 1 "node 1 sent nothing for 3 s"
	via=$outer_via
	if [ -n "$caller_polls" ]; then DEX_POLL_US=$caller_poll_us; else unset DEX_POLL_US; fi
}
polling_checks " [polling receivers]"
# the runtime's numeric settings are checked like command-line arguments
DEX_POLL_US=5ms run $DEXRUN -n 2 "$BUILD/hello_nodes"
rc=$?
if [ $rc -ne 0 ] && grep -qF "DEX_POLL_US must be a whole number from 0 to 1000000, not '5ms'" "$LOG/out" &&
	! grep -q "back on node 0" "$LOG/out"; then
	pass "a malformed DEX_POLL_US is named and nothing runs (rc $rc)"
else
	fail "malformed DEX_POLL_US (rc $rc)" "$LOG/out"
fi

# 9. the UCX transport (UCX's shared-memory/TCP transports on loopback):
# the same launcher, coherence and application tests, and a killed node
if [ -f "$BUILD/libdex-ucx.so" ]; then
	DEXRUN="$BUILD/dexrun --timeout 100 --transport ucx"
	via=" [ucx]"
	for n in 1 2 3; do
		check_output "hello_nodes on $n node(s)$via" "back on node 0" $DEXRUN -n $n "$BUILD/hello_nodes"
	done
	coherence_tests
	all_app_runs
	killed_node_check 424242431 "$via"
	check_status "a stranger with the origin's UCX address injects nothing: its message dropped, the run finishes$via" \
		150 python3 tests/ucx_stranger.py "$BUILD"
	grant_hold_check "$via"
	# silence is noticed by the heartbeat over UCX too
	stop_test 0 "the origin sent nothing for 3 s"
	polling_checks " [ucx, polling]"
else
	echo "SKIP UCX transport: $BUILD/libdex-ucx.so not built (install libucx-dev: scripts/bootstrap.sh)"
fi

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
