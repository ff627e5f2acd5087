#!/usr/bin/env bash
# dexrun --hosts with two "hosts": network namespaces joined to this one by
# veth pairs, each running an sshd and a dexnode agent on its own address.
# Over ssh (dexrun --hosts FILE, the standard way):
#   S1. a 3-node run is correct, over TCP and, if built, over UCX;
#   S2. the run's secret is on no process's command line;
#   S3. Ctrl-C on dexrun ends the remote nodes too.
# Through the dexnode agents (dexrun --hosts FILE --secret-file FILE):
#   1. a 3-node run (origin here, a node in each namespace) is correct, over
#      TCP and, if built, over UCX;
#   2. a host whose binary differs (another program bind-mounted over the
#      path in the agent's mount namespace) is refused by the layout check;
#   3. killing dexrun kills the remote nodes (the agents see the hang-up);
#   4. dexrun with another secret file is refused by the agents.
# Needs root and iproute2. Usage: tests/hosts_netns.sh BUILD_DIR
set -u
BUILD=${1:-build}
tag=$$
subnet=$((200 + tag % 50))
namespaces=() links=() agents=() sshds=()
cleanup() {
	for a in "${agents[@]}" "${sshds[@]}"; do kill "$a" 2>/dev/null; done
	wait 2>/dev/null
	for l in "${links[@]}"; do ip link del "$l" 2>/dev/null; done
	for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null; done
	rm -f "$hosts" "$bad_hosts" "$out" "$secret" "$other_secret"
	rm -rf "$sshdir"
}
trap cleanup EXIT
hosts=$(mktemp) bad_hosts=$(mktemp) out=$(mktemp) secret=$(mktemp) other_secret=$(mktemp) sshdir=$(mktemp -d)
# the agents' secret (mktemp makes it 0600), as dexnode and dexrun require
od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$secret"
od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$other_secret"
failures=0
check() { # description command...
	local what=$1
	shift
	if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; sed 's/^/    /' "$out" | tail -15; failures=$((failures + 1)); fi
}

# host k: namespace dexh<tag>k, 10.<subnet>.k.2 inside, .1 on our side
make_host() { # k [command prefix for the agent]
	local k=$1 ns=dexh${tag}$1 outside=dxh${tag}o$1 inside=dxh${tag}i$1
	shift
	ip netns add "$ns" || return 1
	namespaces+=("$ns")
	ip link add "$outside" type veth peer name "$inside" netns "$ns" || return 1
	links+=("$outside")
	ip addr add "10.$subnet.$k.1/24" dev "$outside"
	ip link set "$outside" up
	ip -n "$ns" addr add "10.$subnet.$k.2/24" dev "$inside"
	ip -n "$ns" link set "$inside" up
	ip -n "$ns" link set lo up
	# as on a real network, every host reaches all of the origin's addresses
	ip -n "$ns" route add default via "10.$subnet.$k.1"
	ip netns exec "$ns" "$@" "$BUILD/dexnode" --secret-file "$secret" --listen "10.$subnet.$k.2:7450" 2>/dev/null &
	agents+=($!)
}
make_host 1 || exit 1
make_host 2 || exit 1
wait_listening() { # k address-pattern: until host k has a TCP socket listening there (5 s at most)
	for _ in $(seq 50); do
		ip netns exec "dexh${tag}$1" ss -ltn 2>/dev/null | grep -q "$2" && break
		sleep 0.1
	done
}

# host 3 has "another binary" at the same path: its own mount namespace
# with hello_nodes mounted over coherence
make_host 3 unshare -m sh -c "mount --bind $BUILD/hello_nodes $BUILD/coherence && exec \"\$0\" \"\$@\"" || exit 1
for k in 1 2 3; do wait_listening $k ":7450 "; done
printf '# two hosts\n10.%s.1.2\n10.%s.2.2:7450\n' "$subnet" "$subnet" >"$hosts"
printf '10.%s.1.2\n10.%s.3.2\n' "$subnet" "$subnet" >"$bad_hosts"

# a 3-node mutex run is right, and its nodes are in 3 network namespaces
run_ok() { # transport dexrun-arguments...
	local transport=$1
	shift
	# UCX would see one machine and pick shared memory, whose wake-up
	# socket (abstract unix) does not cross network namespaces: make the
	# namespaced hosts talk UCX over TCP, as separate machines would.
	UCX_TLS=tcp,self timeout 60 "$BUILD/dexrun" --timeout 50 --transport "$transport" "$@" "$BUILD/coherence" mutex 6 500 >"$out" 2>&1 &&
		grep -q "PASS mutex: counter 3000, expected 3000 on 3 nodes" "$out" &&
		UCX_TLS=tcp,self timeout 60 "$BUILD/dexrun" --timeout 50 --transport "$transport" "$@" "$BUILD/netns_probe" >"$out" 2>&1 &&
		grep -q "3 distinct for 3 nodes" "$out"
}

# Ctrl-C to dexrun ($1); sets $rc; true if no process runs the marker $2 at most $3 s later
interrupted_and_gone() {
	kill -INT "$1"
	wait "$1"
	rc=$?
	for _ in $(seq $(($3 * 10))); do
		[ -z "$(pgrep -f -- "$2")" ] && return 0
		sleep 0.1
	done
	return 1
}

# the secret is in the nodes' environments and on no command line; Ctrl-C
# ends them all
ssh_secret_and_ctrl_c() {
	"$BUILD/dexrun" --hosts "$sshdir/hosts" "$BUILD/coherence" pingpong 2 424242442 >"$out" 2>&1 &
	local runner=$! nodes=() secret_of=() p
	for _ in $(seq 50); do
		mapfile -t nodes < <(pgrep -f -- "^$BUILD/coherence pingpong 2 424242442")
		[ ${#nodes[@]} -ge 3 ] && break
		sleep 0.1
	done
	sleep 0.5
	for p in "${nodes[@]}"; do
		secret_of+=("$(tr '\0' '\n' </proc/"$p"/environ 2>/dev/null | sed -n 's/^DEX_RUN_SECRET=//p')")
	done
	# from a file: on grep's command line it would be found
	printf '%s\n' "${secret_of[0]:-none}" >"$sshdir/needle"
	local shown=0
	for p in /proc/[0-9]*; do
		grep -qaFf "$sshdir/needle" "$p/cmdline" 2>/dev/null && shown=1
	done
	local gone=0 rc
	interrupted_and_gone "$runner" 424242442 5 && gone=1
	echo "nodes ${#nodes[@]}, secrets '${secret_of[*]}', on a command line $shown, rc $rc, gone $gone" >>"$out"
	[ ${#nodes[@]} -ge 3 ] && [ ${#secret_of[0]} = 64 ] && [ "${secret_of[0]}" = "${secret_of[1]}" ] &&
		[ "${secret_of[0]}" = "${secret_of[2]}" ] && [ $shown = 0 ] && [ $rc -eq 130 ] && [ $gone = 1 ]
}

# an sshd in hosts 1 and 2 that admits a key made here, and an ssh client
# configuration that trusts only their host key (needs openssh-server)
over_ssh() {
	ssh-keygen -q -t ed25519 -N '' -f "$sshdir/host_key" && ssh-keygen -q -t ed25519 -N '' -f "$sshdir/id" || exit 1
	cp "$sshdir/id.pub" "$sshdir/authorized_keys"
	echo "* $(cat "$sshdir/host_key.pub")" >"$sshdir/known_hosts"
	cat >"$sshdir/sshd_config" <<-CONF
	HostKey $sshdir/host_key
	AuthorizedKeysFile $sshdir/authorized_keys
	PermitRootLogin prohibit-password
	PasswordAuthentication no
	KbdInteractiveAuthentication no
	UsePAM no
	StrictModes no
	PidFile none
	CONF
	cat >"$sshdir/ssh_config" <<-CONF
	IdentityFile $sshdir/id
	IdentitiesOnly yes
	UserKnownHostsFile $sshdir/known_hosts
	StrictHostKeyChecking yes
	LogLevel ERROR
	CONF
	mkdir -p /run/sshd # sshd's privilege-separation directory
	for k in 1 2; do
		ip netns exec "dexh${tag}$k" /usr/sbin/sshd -D -e -f "$sshdir/sshd_config" -o "ListenAddress=10.$subnet.$k.2:22" \
			2>>"$sshdir/sshd.log" &
		sshds+=($!)
	done
	export DEX_SSH="ssh -F $sshdir/ssh_config"
	printf '# two hosts, through ssh\n10.%s.1.2\nroot@10.%s.2.2:22\n' "$subnet" "$subnet" >"$sshdir/hosts"
	for k in 1 2; do wait_listening $k "10.$subnet.$k.2:22 "; done
	check "--hosts over ssh: 3 nodes, 2 on namespaced hosts (tcp): mutex counter and 3 network namespaces" run_ok tcp --hosts "$sshdir/hosts"
	if [ -f "$BUILD/libdex-ucx.so" ]; then
		check "--hosts over ssh, UCX (UCX_TLS=tcp,self)" run_ok ucx --hosts "$sshdir/hosts"
	fi
	check "over ssh the run's secret reaches every node on no command line; Ctrl-C ends the remote nodes" ssh_secret_and_ctrl_c
}
if [ -x /usr/sbin/sshd ]; then
	over_ssh
else
	echo "skipped: --hosts over ssh (no /usr/sbin/sshd: openssh-server)"
fi

check "--hosts: 3 nodes, 2 on namespaced hosts through dexnode agents (tcp): mutex counter and 3 network namespaces" run_ok tcp --hosts "$hosts" --secret-file "$secret"
if [ -f "$BUILD/libdex-ucx.so" ]; then
	check "--hosts over UCX (UCX_TLS=tcp,self)" run_ok ucx --hosts "$hosts" --secret-file "$secret"
fi

refused() {
	# a join timeout shorter than the 3 s dexrun grants the origin to report a failed node
	DEX_JOIN_TIMEOUT=2 timeout 60 "$BUILD/dexrun" --timeout 50 --hosts "$bad_hosts" --secret-file "$secret" "$BUILD/coherence" mutex 2 10 \
		>"$out" 2>&1
	local rc=$?
	[ $rc -ne 0 ] && grep -q "address-space layout differs" "$out" && grep -q "only 1 of 2 nodes joined" "$out"
}
check "a host whose binary differs is refused by the layout check" refused

killed() {
	"$BUILD/dexrun" --hosts "$hosts" --secret-file "$secret" "$BUILD/coherence" pingpong 2 424242441 >"$out" 2>&1 &
	local runner=$!
	sleep 1.5
	local before
	before=$(pgrep -f -- 424242441 | wc -l)
	local rc
	interrupted_and_gone "$runner" 424242441 3 && [ "$before" -ge 3 ] && [ $rc -eq 130 ]
}
check "Ctrl-C on dexrun ends the remote nodes too (agents kill them)" killed

wrong_secret() {
	timeout 60 "$BUILD/dexrun" --timeout 50 --hosts "$hosts" --secret-file "$other_secret" "$BUILD/coherence" mutex 2 10 \
		>"$out" 2>&1
	local rc=$?
	[ $rc -ne 0 ] && grep -q "dexnode agent at 10.$subnet.1.2:7450: refused: wrong secret" "$out" &&
		! grep -q "PASS mutex" "$out"
}
check "dexrun with another secret is refused by the agents; nothing runs" wrong_secret

[ $failures -eq 0 ]
