#!/usr/bin/env bash
# DEX under Slurm: `srun -N 2 --mpi=pmix` with a slurmctld here and a slurmd
# in each of two network namespaces (two "nodes" n1, n2 on a bridge, each
# with a spool directory of its own), munge authenticating every Slurm message with a
# key made here.
# Rank 0 (on n1) is the origin; rank 1 (on n2) finds it through Slurm's
# PMIx server and proves DEX_RUN_SECRET, which srun exports to the tasks.
#   1. a thread visits n2 and comes back; the mutex counter is right; the
#      two ranks run in two network namespaces;
#   2. without DEX_RUN_SECRET neither task starts.
# Needs root, iproute2, slurmctld, slurmd, slurm-client and munge.
# Usage: tests/slurm_netns.sh BUILD. Exit status non-zero if any fails.
set -u
BUILD=$(cd "${1:-build}" && pwd)
tag=$$
subnet=$((150 + tag % 50))
# not under /tmp, which a CI clone may be in too
dir=$(mktemp -d /var/tmp/dex-slurm.XXXXXX)
chmod 755 "$dir"
pids=() namespaces=() links=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	for l in "${links[@]}"; do ip link del "$l" 2>/dev/null; done
	for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null; done
	rm -rf "$dir"
}
trap cleanup EXIT
trap "exit 1" INT TERM
failed=0
check() { # description command...
	local what=$1
	shift
	if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; sed 's/^/    /' "$dir/out" | tail -15; failed=1; fi
}

# one bridge here (10.S.0.1) and a namespace per node (10.S.0.2, 10.S.0.3):
# the nodes talk to each other too, without routing through this host
bridge=dxsb$tag
ip link add "$bridge" type bridge || exit 1
links+=("$bridge")
ip addr add "10.$subnet.0.1/24" dev "$bridge"
ip link set "$bridge" up
for k in 1 2; do
	ns=dexs${tag}$k outside=dxs${tag}o$k inside=dxs${tag}i$k
	ip netns add "$ns" || exit 1
	namespaces+=("$ns")
	ip link add "$outside" type veth peer name "$inside" netns "$ns" || exit 1
	links+=("$outside")
	ip link set "$outside" master "$bridge" up
	ip -n "$ns" addr add "10.$subnet.0.$((k + 1))/24" dev "$inside"
	ip -n "$ns" link set "$inside" up
	ip -n "$ns" link set lo up
done

# munge with a key of this test's own, on a socket of its own
dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 2>/dev/null
chmod 600 "$dir/munge.key"
munged --force --foreground --key-file="$dir/munge.key" --socket="$dir/munge.sock" --pid-file="$dir/munged.pid" \
	--log-file="$dir/munged.log" --seed-file="$dir/munged.seed" 2>>"$dir/munged.log" &
pids+=($!)

port=$((20000 + tag % 20000))
mkdir -p "$dir/state"
cat >"$dir/slurm.conf" <<CONF
ClusterName=dex$tag
SlurmctldHost=$(hostname -s)(10.$subnet.0.1)
MailProg=/bin/true
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SwitchType=switch/none
MpiDefault=pmix
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/linear
NodeName=n1 NodeAddr=10.$subnet.0.2 CPUs=2 State=UNKNOWN
NodeName=n2 NodeAddr=10.$subnet.0.3 CPUs=2 State=UNKNOWN
PartitionName=dex Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
CONF
# The PMIx plugin's per-step client directories are named alike on every node:
# each slurmd gets its own (bound over this path, as the spool below).
echo "PMIxCliTmpDirBase=$dir/pmix" >"$dir/mpi.conf"
export SLURM_CONF=$dir/slurm.conf
for _ in $(seq 50); do [ -S "$dir/munge.sock" ] && break; sleep 0.1; done
slurmctld -D -i -f "$SLURM_CONF" 2>>"$dir/slurmctld.err" &
pids+=($!)
for k in 1 2; do
	# nsenter, not ip netns exec, which mounts another /sys without cgroups;
	# a spool and a PMIx directory of its own, as another machine has: Slurm's
	# PMIx server makes its sockets there under names that differ only between
	# jobs, and does not expand %n in SlurmdSpoolDir. Only these two are
	# private (bound over the shared paths): the job's files, wherever they
	# are (a CI clone may be under /tmp), are seen by both nodes.
	mkdir -p "$dir/spool" "$dir/spool-n$k" "$dir/pmix" "$dir/pmix-n$k"
	nsenter --net="/run/netns/dexs${tag}$k" unshare -m --propagation private \
		sh -c 'mount --bind "$1/spool-$2" "$1/spool" && mount --bind "$1/pmix-$2" "$1/pmix" && shift 2 && exec "$@"' \
		sh "$dir" "n$k" slurmd -D -N "n$k" -f "$SLURM_CONF" 2>>"$dir/slurmd.err" &
	pids+=($!)
done
for _ in $(seq 100); do # until both nodes are idle
	[ "$(sinfo -h -o '%t %D' 2>/dev/null)" = "idle 2" ] && break
	sleep 0.2
done
sinfo >"$dir/out" 2>&1
DEX_RUN_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
export DEX_RUN_SECRET
cd "$dir" # a working directory both nodes see (not /tmp)

two_nodes() {
	timeout 120 srun -N 2 -n 2 --mpi=pmix "$BUILD/hello_nodes" >"$dir/out" 2>&1 &&
		grep -q "back on node 0: visits 1" "$dir/out" &&
		timeout 120 srun -N 2 -n 2 --mpi=pmix "$BUILD/coherence" mutex 4 300 >"$dir/out" 2>&1 &&
		grep -q "PASS mutex" "$dir/out" &&
		timeout 120 srun -N 2 -n 2 --mpi=pmix "$BUILD/netns_probe" >"$dir/out" 2>&1 &&
		grep -q "2 distinct for 2 nodes" "$dir/out"
}
check "srun -N 2 --mpi=pmix: the thread visits n2 and comes back; mutex counter right; 2 network namespaces" two_nodes

no_secret() {
	! env -u DEX_RUN_SECRET timeout 120 srun -N 2 -n 2 --mpi=pmix "$BUILD/hello_nodes" >"$dir/out" 2>&1 &&
		[ "$(grep -c "DEX_RUN_SECRET: it is not set" "$dir/out")" = 2 ]
}
check "srun without DEX_RUN_SECRET: neither task starts" no_secret
[ $failed = 0 ] || for f in "$dir"/*.log "$dir"/*.err; do
	echo "== $f"
	grep -i 'error\|pmix' "$f" | tail -12
done
exit $failed
