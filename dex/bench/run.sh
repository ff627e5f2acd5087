#!/usr/bin/env bash
# DEX benchmarks: migration latency, remote fault latency, app scaling.
# Prints a markdown report (ours beside DEX, ICDCS'20 Table II and §V-D)
# and writes it to docs/results/dex-bench.md.
# usage: dex/bench/run.sh [runs] [latency]   (medians over `runs` process runs, default 5;
#        `latency`: only the migration and fault latencies, printed, the report file left as it is;
#        POLL_US=N: the polling columns' DEX_POLL_US, default 1000)
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
dex=$root/dex
build=$dex/build
runs=${1:-5}
parts=${2:-all}
case $parts in all | latency) ;; *) echo "usage: $0 [runs] [latency]" >&2; exit 2 ;; esac
[[ $runs =~ ^[1-9][0-9]{0,3}$ ]] || { echo "dex/bench: runs must be a whole number from 1 up, not '$runs'" >&2; echo "usage: $0 [runs] [latency]" >&2; exit 2; }
poll_us=${POLL_US:-1000} # DEX_POLL_US of the polling columns
[[ $poll_us =~ ^[1-9][0-9]{0,6}$ ]] && [ "$poll_us" -le 1000000 ] ||
	{ echo "dex/bench: POLL_US must be a whole number of microseconds from 1 to 1000000, not '$poll_us'" >&2; exit 2; }
report=$root/docs/results/dex-bench.md
[ "$parts" = all ] || report=/dev/null
make -s -C "$dex" >/dev/null
load_at_start=$(cut -d' ' -f1-3 /proc/loadavg)
out=$(mktemp)
trap 'rm -f "$out" "$out".*' EXIT

median() { sort -n | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }
metric() { grep "^$1 " "$out.$2" | awk '{ print $2 }' | median; }

# How an idle vCPU waits decides what every cross-CPU wake-up costs in a virtual machine. Linux's
# cpuidle-haltpoll driver polls 200 us (guest_halt_poll_ns) before halting; a host may boot its
# guests with 0 (this machine does), making each wake-up of an idle vCPU a trip through the
# hypervisor. The latency runs go once with the machine's setting and, where the knob exists and
# is writable, once with Linux's default, side by side; the setting is restored on exit.
halt_poll=/sys/module/haltpoll/parameters/guest_halt_poll_ns
machine_poll=$(cat "$halt_poll" 2>/dev/null || echo "none")
settings="machine"
if [ -w "$halt_poll" ] && [ "$machine_poll" != 200000 ]; then
	settings="machine poll"
	trap 'echo "$machine_poll" >"$halt_poll"; rm -f "$out" "$out".*' EXIT
fi
# Other work on this shared machine moves every figure: each latency run starts after a second in
# which both CPUs were at least 90% idle, or after waiting a minute for one (counted).
starts=0 busy_starts=0
wait_quiet() {
	local waited=0 before after total idle i
	starts=$((starts + 1))
	while [ $waited -lt 60 ]; do
		read -ra before </proc/stat
		sleep 1
		read -ra after </proc/stat
		total=0
		for i in 1 2 3 4 5 6 7 8; do total=$((total + after[i] - before[i])); done
		idle=$(((after[4] - before[4]) * 100 / (total > 0 ? total : 1)))
		[ $idle -ge 90 ] && return
		waited=$((waited + 1))
	done
	busy_starts=$((busy_starts + 1))
}
cc -O2 -o "$out.wake" "$root/dex/bench/wake_latency.c"
for setting in $settings; do
	if [ "$setting" = poll ]; then echo 200000 >"$halt_poll"; fi
	wait_quiet
	"$out.wake" >"$out.$setting.wakes"
	for i in $(seq "$runs"); do
		wait_quiet
		"$build/dexrun" -n 2 --timeout 60 "$build/migration_latency" 300 >>"$out.$setting.mig"
		"$build/dexrun" -n 2 --timeout 60 "$build/fault_latency" 2000 5000 >>"$out.$setting.fault"
		if [ "$setting" = machine ]; then # receivers polling: no idle vCPU to wake
			DEX_POLL_US=$poll_us "$build/dexrun" -n 2 --timeout 60 "$build/migration_latency" 300 >>"$out.polling.mig"
			DEX_POLL_US=$poll_us "$build/dexrun" -n 2 --timeout 60 "$build/fault_latency" 2000 5000 >>"$out.polling.fault"
		fi
		if [ -f "$build/libdex-ucx.so" ]; then # the same over the UCX transport (UCX_TLS defaults)
			"$build/dexrun" -n 2 --timeout 60 --transport ucx "$build/migration_latency" 300 >>"$out.$setting.ucxmig"
			"$build/dexrun" -n 2 --timeout 60 --transport ucx "$build/fault_latency" 2000 5000 >>"$out.$setting.ucxfault"
			if [ "$setting" = machine ]; then
				DEX_POLL_US=$poll_us "$build/dexrun" -n 2 --timeout 60 --transport ucx "$build/migration_latency" 300 \
					>>"$out.polling.ucxmig"
				DEX_POLL_US=$poll_us "$build/dexrun" -n 2 --timeout 60 --transport ucx "$build/fault_latency" 2000 5000 \
					>>"$out.polling.ucxfault"
			fi
		fi
	done
	touch "$out.$setting.ucxmig" "$out.$setting.ucxfault" "$out.polling.ucxmig" "$out.polling.ucxfault"
	if [ "$setting" = poll ]; then echo "$machine_poll" >"$halt_poll"; fi
done
ucx() { local v; v=$(metric "$1" "$2"); echo "${v:-not built}"; }
# One table cell per idle setting: "machine | poll" (or only the machine's).
cells() { # metric file-suffix [ucx]
	local setting sep="" v
	for setting in $settings; do
		if [ "${3:-}" = ucx ]; then v=$(ucx "$1" "$setting.$2"); else v=$(metric "$1" "$setting.$2"); fi
		printf '%s%s' "$sep" "$v"
		sep=" | "
	done
}
floor() { # name -> "machine | poll" figures from wake_latency
	local setting sep=""
	for setting in $settings; do
		printf '%s%s' "$sep" "$(awk -v n="$1" '$1 == n { print $2 }' "$out.$setting.wakes")"
		sep=" | "
	done
}
floor_dashes() { local setting; for setting in $settings; do printf ' — |'; done; }
setting_headers() { # transport
	printf '%s, guest_halt_poll_ns=%s (this machine)' "$1" "$machine_poll"
	case $settings in *poll*) printf ' | %s, guest_halt_poll_ns=200000 (Linux default)' "$1" ;; esac
}
polling_header() { # transport
	printf 'clowder dex, %s, receivers polling (DEX_POLL_US=%s), guest_halt_poll_ns=%s' "$1" "$poll_us" "$machine_poll"
}
setting_aligns() { local setting; for setting in $settings; do printf '%s' '---|'; done; }

seconds() { # command... -> wall seconds
	local t0 t1
	t0=$(date +%s.%N)
	"$@" >/dev/null
	t1=$(date +%s.%N)
	echo "$t1 - $t0" | bc -l
}
# One line per counter and node: "name node value" from a KMN run's DEX_STATS.
kmeans_stats() { # iterations
	DEX_STATS=1 "$build/dexrun" -n 2 --timeout 120 "$build/kmeans" 2 2000000 16 "$1" 2>&1 >/dev/null |
		awk '/stats: faults/ {
			node = $2; sub(/\].*/, "", node)
			print "read-faults", node, $5; print "write-faults", node, $7
			print "pages-received", node, $9
			print "invalidations-served", node, $17; print "syscalls-delegated", node, $20
		}'
}

scale_row() { # label dex-figure plain-1-thread plain-2-threads dex-args
	local label=$1 paper=$2 plain=$3 plain2=$4 dexargs=$5 base two t i
	: >"$out.base"
	: >"$out.two"
	: >"$out.dex"
	# The three alternate, so that other work on the machine hits them alike.
	for i in $(seq "$runs"); do
		seconds $plain >>"$out.base"
		seconds $plain2 >>"$out.two"
		seconds "$build/dexrun" -n 2 --timeout 120 $dexargs >>"$out.dex"
	done
	base=$(median <"$out.base")
	two=$(median <"$out.two")
	t=$(median <"$out.dex")
	printf '| %s | %s | %.2f | %.2f (%.2fx) | %.2f | %.2fx |\n' "$label" "$paper" "$base" "$two" \
		"$(echo "$base / $two" | bc -l)" "$t" "$(echo "$base / $t" | bc -l)"
}

{
	echo "# DEX benchmarks (clowder, user space, TCP and UCX loopback)"
	echo
	echo "Generated by \`dex/bench/run.sh $runs\` on $(date -u +%Y-%m-%d) — $(nproc) vCPUs, $(uname -r),"
	echo "load average at start: $load_at_start (the machine is shared with other builds)."
	echo "Medians over $runs process runs; each run's own figure is a median over 300 migrations or"
	echo "2000 faults. Each latency run started after a second with both CPUs at least 90% idle"
	echo "($busy_starts of $starts waited a minute without one and started anyway)."
	echo "DEX figures: Kim et al., ICDCS 2020, Table II (averages) and §V-D (InfiniBand, kernel)."
	echo "Figures: [dex-latency.png](dex-latency.png), [dex-scaling.png](dex-scaling.png) (\`bench/plot.py\`)."
	echo "Where the time of a migration or a fault goes, what changed it and what was tried:"
	echo "[dex-analysis.md](dex-analysis.md) (hand-written; this file is regenerated by every full run)."
	echo
	echo "## Migration latency (µs)"
	echo
	echo "Each clowder column is one idle setting of this virtual machine's vCPUs (see *The host's"
	echo "wake-up cost* below): the machine as it boots, and Linux's default halt polling; the TCP"
	echo "polling column keeps the receivers awake instead (DEX_POLL_US, dex/README.md)."
	echo
	echo "| | DEX (Popcorn kernel, IB) | $(setting_headers "clowder dex, TCP loopback") | $(polling_header "TCP loopback") | $(setting_headers "clowder dex, \`--transport ucx\`") | $(polling_header "\`--transport ucx\`") | issue target |"
	echo "|---|---|$(setting_aligns)---|$(setting_aligns)---|---|"
	echo "| first forward (thread's first visit to the node) | 812.1 | $(cells first_forward_us mig) | $(metric first_forward_us polling.mig) | $(cells first_forward_us ucxmig ucx) | $(ucx first_forward_us polling.ucxmig) | ≤ 400 |"
	echo "| later forward (pooled worker) | 236.6 | $(cells later_forward_us mig) | $(metric later_forward_us polling.mig) | $(cells later_forward_us ucxmig ucx) | $(ucx later_forward_us polling.ucxmig) | ≤ 120 |"
	echo "| first backward | 24.7 | $(cells first_backward_us mig) | $(metric first_backward_us polling.mig) | $(cells first_backward_us ucxmig ucx) | $(ucx first_backward_us polling.ucxmig) | ≤ 40 |"
	echo "| later backward | 25.8 | $(cells later_backward_us mig) | $(metric later_backward_us polling.mig) | $(cells later_backward_us ucxmig ucx) | $(ucx later_backward_us polling.ucxmig) | ≤ 40 |"
	echo "| floor: pipe round trip between two processes on the two CPUs (no DEX) | — | $(floor pipe-cross-cpu) | — |$(floor_dashes) — | |"
	echo
	echo "DEX's first forward includes creating the remote worker (620 µs). Here node processes are set"
	echo "up at launch and each starts with two idle worker threads, so a first visit costs the thread's"
	echo "first page faults on that node and waking a long-idle thread, and no thread is created while it"
	echo "runs (the spare it leaves is replaced off the critical path). First forward/backward are one"
	echo "sample per process run (a process migrates to a node for the first time once), so they carry"
	echo "the machine's noise: a first forward ranged from about 80 µs on an idle machine to 3 ms under load."
	echo
	echo "## Remote page fault, 4 KiB (µs)"
	echo
	echo "| | DEX | $(setting_headers "clowder dex (TCP)") | $(polling_header "TCP loopback") | $(setting_headers "clowder dex (UCX)") | $(polling_header "UCX") | issue target |"
	echo "|---|---|$(setting_aligns)---|$(setting_aligns)---|---|"
	echo "| read fault, page at the origin (median; descending, so no readahead) | 13.6 (page fetch) | $(cells read_fault_median_us fault) | $(metric read_fault_median_us polling.fault) | $(cells read_fault_median_us ucxfault ucx) | $(ucx read_fault_median_us polling.ucxfault) | ≤ 15 |"
	echo "| read fault, 90th percentile | — | $(cells read_fault_p90_us fault) | $(metric read_fault_p90_us polling.fault) | $(cells read_fault_p90_us ucxfault ucx) | $(ucx read_fault_p90_us polling.ucxfault) | |"
	echo "| write fault, exclusive + data (median) | — | $(cells write_fault_median_us fault) | $(metric write_fault_median_us polling.fault) | $(cells write_fault_median_us ucxfault ucx) | $(ucx write_fault_median_us polling.ucxfault) | |"
	echo "| contended: one page written alternately by 2 nodes, per transfer (mean) | 158.8 (retried faults) | $(cells contended_transfer_mean_us fault) | $(metric contended_transfer_mean_us polling.fault) | $(cells contended_transfer_mean_us ucxfault ucx) | $(ucx contended_transfer_mean_us polling.ucxfault) | |"
	echo "| sequential read of 2000 pages, per page (readahead) | — | $(cells sequential_read_per_page_us fault) | $(metric sequential_read_per_page_us polling.fault) | $(cells sequential_read_per_page_us ucxfault ucx) | $(ucx sequential_read_per_page_us polling.ucxfault) | |"
	echo "| floor: loopback TCP round trip, 64 B asked, 4 KiB + 64 B answered, across the CPUs (no DEX) | — | $(floor tcp-page-cross-cpu) | $(awk '$1 == "tcp-page-polling-cross-cpu" { print $2 }' "$out.machine.wakes") (both sides polling) |$(floor_dashes) — | |"
	echo "| the same floor with both processes on one CPU | — | $(floor tcp-page-same-cpu) | — |$(floor_dashes) — | |"
	echo
	echo "A remote read fault is that TCP round trip plus the SIGSEGV, the directory and three"
	echo "thread hand-offs (the faulting thread, the origin's receiver, this node's receiver), so"
	echo "the target is below what loopback TCP alone takes on this machine whenever the floor is."
	echo
	echo "UCX runs use UCX's own transport choice (UCX_TLS unset: shared memory between the two"
	echo "processes here, as an RDMA fabric between machines: a 64 B → 4 KiB round trip of UCX alone"
	echo "takes 0.4 µs with both sides polling). UCX must not be called from the runtime's signal"
	echo "handlers, so a message another thread sends is handed to the process's pump; a process"
	echo "with one peer (every node, and the origin of these two-node runs) pumps from its receiver"
	echo "thread, so an incoming message is read by the thread that applies it. With polling, the"
	echo "pumps stay awake and a faulting thread yields while its grant comes instead of sleeping"
	echo "(dex/README.md, DEX_POLL_US)."
	echo
	if [ "$parts" = all ]; then
		echo "## Scaling, 1 node → 2 nodes (wall seconds, startup included)"
		echo
		echo "Baseline: the unmodified program, 1 thread (one core). DEX: 2 nodes, one thread each."
		echo "The plain 2-thread column shows what this 2-vCPU machine, shared with other work, can give"
		echo "two threads at all; DEX cannot beat it here. Separate machines would not have this ceiling."
		echo "Each row alternates baseline, plain 2 threads and DEX $runs times; medians. DEX's Figure 2"
		echo "(8 threads per node, InfiniBand) is a plot without numbers in the text; its trend is quoted."
		echo
		echo "| app | DEX, 1 → 2 nodes (Fig. 2) | baseline: plain, 1 thread | plain, 2 threads, 1 node (machine ceiling) | DEX 2 nodes × 1 thread | DEX speed-up |"
		echo "|---|---|---|---|---|---|"
		scale_row "EP optimised (2^26 samples)" "scales linearly" "$build/ep 1 26" "$build/ep 2 26" "$build/ep 2 26"
		scale_row "EP naive (2^24 samples)" "scales, below optimised" "$build/ep 1 24" "$build/ep --naive 2 24" \
			"$build/ep --naive 2 24"
		# Small-input rows give the baseline about a second (the nodes' start-up, included, is
		# amortised); the paper-sized rows a few seconds.
		# KMN and BLK at the paper's work per input byte (DEX used 5M points and 100 centres;
		# PARSEC's blackscholes prices every option 100 times), then at a small input.
		scale_row "KMN optimised (paper's 5M points, 100 clusters; 6 it.)" "scales once optimised" \
			"$build/kmeans 1 5000000 100 6" "$build/kmeans 2 5000000 100 6" "$build/kmeans 2 5000000 100 6"
		scale_row "KMN optimised, small input (2M points, 16 clusters, 40 it.)" "(degrades with small data per core, §V)" \
			"$build/kmeans 1 2000000 16 40" "$build/kmeans 2 2000000 16 40" "$build/kmeans 2 2000000 16 40"
		scale_row "KMN naive (400k points)" "does not scale" "$build/kmeans 1 400000 16 10" \
			"$build/kmeans --naive 2 400000 16 10" "$build/kmeans --naive 2 400000 16 10"
		scale_row "GRP optimised (64 MiB text)" "scales once optimised" "$build/grp 1 64" "$build/grp 2 64" "$build/grp 2 64"
		scale_row "GRP naive (16 MiB text)" "does not scale" "$build/grp 1 16" "$build/grp --naive 2 16" \
			"$build/grp --naive 2 16"
		scale_row "BLK optimised (1M options, PARSEC's 100 rounds)" "scales linearly (no change needed)" \
			"$build/blk 1 1048576 100" "$build/blk 2 1048576 100" "$build/blk 2 1048576 100"
		scale_row "BLK optimised, small input (1M options, 16 rounds)" "(degrades with small data per core, §V)" \
			"$build/blk 1 1048576 16" "$build/blk 2 1048576 16" "$build/blk 2 1048576 16"
		scale_row "BLK naive (256k options, 1 round)" "(same program)" "$build/blk 1 262144 1" \
			"$build/blk --naive 2 262144 1" "$build/blk --naive 2 262144 1"
		echo
		echo "## Where KMN's time goes (DEX_STATS, 2 nodes)"
		echo
		echo "Counters of a 20- and a 40-iteration run of the optimised KMN: their difference over 20 is"
		echo "the cost of one iteration; the rest is moving the inputs to node 1 and node 1's results"
		echo "back to the origin once (how far readahead gets varies a little from run to run, so the"
		echo "difference of large counters is noisy). \"Faults\" are protocol requests (a readahead"
		echo "request brings up to 64 pages)."
		echo
		kmeans_stats 20 >"$out.k20"
		kmeans_stats 40 >"$out.k40"
		echo "| counter | node | 20 iterations | 40 iterations | per iteration |"
		echo "|---|---|---|---|---|"
		paste "$out.k20" "$out.k40" | while read -r name node a _ _ b; do
			printf '| %s | %s | %d | %d | %.1f |\n' "$name" "$node" "$a" "$b" "$(echo "($b - $a) / 20" | bc -l)"
		done
		echo
	fi
	echo "## The host's wake-up cost"
	echo
	echo "A pipe round trip between two processes (two wake-ups, \`dex/bench/wake_latency.c\`), in this run,"
	echo "with this machine's idle setting: $(awk '$1 == "pipe-same-cpu" { print $2 }' "$out.machine.wakes") µs on one CPU,"
	echo "$(awk '$1 == "pipe-cross-cpu" { print $2 }' "$out.machine.wakes") µs across the two. Every DEX message between the two node processes"
	echo "pays a cross-CPU wake-up here, so the migration and fault latencies move with this figure."
	echo "This machine boots with \`haltpoll.guest_halt_poll_ns=$machine_poll\`: an idle vCPU halts at once, and waking it"
	echo "goes through the hypervisor. Linux's default for the cpuidle-haltpoll driver polls 200 µs"
	echo "first; the second column of the latency tables sets it for those runs (a system setting, as"
	echo "\`idle=poll\` is on many HPC nodes; DEX itself needs no change)."
	echo
	echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
} | tee "$report"
if [ "$parts" = all ]; then python3 "$root/bench/plot.py" dex; fi
