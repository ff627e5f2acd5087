# "Nodes" on this machine, for tests and benchmarks of multi-node jobs (sourced: `. nodes.sh`).
# A node is a network namespace joined to a bridge here by a veth pair, with a host name (n1..)
# and a mount namespace of its own, where its node-private directories are bound over shared paths: its clowderd's
# /run/clowder (so `clowder` finds that node's daemon at the default socket, as on a real
# node), Slurm's spool and PMIx directories. Everything else (the source tree, the binaries,
# the job files) is the one file system, as a cluster's shared home is.
#
#   nodes_up N             N nodes n1..nN at 10.S.0.2.. and fd00:S::2.. on a bridge at 10.S.0.1
#                          and fd00:S::1 (S from the pid); each node's interface is $NODES_INTERFACE
#   nodes_exec K CMD...    CMD in node K (network, mount and host-name namespaces)
#   nodes_spawn K LOG CMD...  a daemon in node K, stopped by nodes_down
#   nodes_clowderd K       node K's own clowderd (CLOWDERD: the binary)
#   nodes_enclaves_idle    whether no node's enclave runs a job (CLOWDER: the clowder binary)
#   nodes_limited S CMD... CMD, ended after S seconds: its `clowder run`s first (status 124 then)
#   nodes_sshd             an sshd in every node, admitting a key made here: $NODES_SSH is the
#                          ssh command that reaches them (and trusts only their host key)
#   nodes_slurm            munged, a slurmctld here and one slurmd per node (partition "nodes")
#   nodes_hugepages PAGES  grows the host's 2 MiB hugepage pool by PAGES for the nodes'
#                          enclaves (`--hugepages`); nodes_down gives back what was added
#   nodes_down             stops all of it and removes the namespaces and links (an EXIT trap)
#
# Only addresses this script creates are used. Needs root, iproute2, util-linux; openssh-server
# for nodes_sshd; slurmctld, slurmd, slurm-client and munge for nodes_slurm.

NODES_TAG=$$
NODES_SUBNET=$((100 + NODES_TAG % 50))
NODES_DIR=$(mktemp -d /var/tmp/clowder-nodes.XXXXXX) # not /tmp: a CI clone may be below it
chmod 755 "$NODES_DIR"
NODES_COUNT=0
NODES_PIDS=()
NODES_SSH=
NODES_BRIDGE=cnb$NODES_TAG
NODES_HUGEPAGES=0 # added to the host's pool by nodes_hugepages

nodes_address() { echo "10.$NODES_SUBNET.0.$(($1 + 1))"; } # node K's address; 0 is this host
nodes_address6() { echo "fd00:$NODES_SUBNET::$(($1 + 1))"; } # its IPv6 address (unique local)
NODES_INTERFACE=node0 # every node's interface has this name, as every machine has its eth0
nodes_netns() { echo "cn${NODES_TAG}n$1"; }

nodes_up() { # N
    ip link add "$NODES_BRIDGE" type bridge || return 1
    ip addr add "$(nodes_address 0)/24" dev "$NODES_BRIDGE"
    ip addr add "$(nodes_address6 0)/64" dev "$NODES_BRIDGE" nodad
    ip link set "$NODES_BRIDGE" up
    local k
    for k in $(seq "$1"); do
        local ns outside=cn${NODES_TAG}o$k inside=$NODES_INTERFACE
        ns=$(nodes_netns "$k")
        ip netns add "$ns" || return 1
        NODES_COUNT=$k
        ip link add "$outside" type veth peer name "$inside" netns "$ns" || return 1
        ip link set "$outside" master "$NODES_BRIDGE" up
        ip -n "$ns" addr add "$(nodes_address "$k")/24" dev "$inside"
        # IPv6 too (before the LWK had netlink and the interface ioctls, enclave ranks listed
        # interfaces from /proc/net/if_inet6 alone)
        ip -n "$ns" addr add "$(nodes_address6 "$k")/64" dev "$inside" nodad
        ip -n "$ns" link set "$inside" up
        ip -n "$ns" link set lo up
        mkdir -p "$NODES_DIR/n$k/run" "$NODES_DIR/n$k/spool" "$NODES_DIR/n$k/pmix" "$NODES_DIR/n$k/sys"
    done
    mkdir -p /run/clowder "$NODES_DIR/spool" "$NODES_DIR/pmix"
}

# nsenter, not `ip netns exec`, which mounts another /sys without the cgroups slurmd reads;
# only /sys/class/net is the node's own (a sysfs mounted in the node's private mount
# namespace): UCX's tcp transport lists its devices there, in host ranks and, through their
# daemon's file calls, in enclave ranks.
nodes_enter() { # K: NODES_ENTER, the command words that run what follows them in node K
    NODES_ENTER=(nsenter --net="/run/netns/$(nodes_netns "$1")" unshare -m -u --propagation private sh -c '
        node=$1; shift
        hostname "${node##*/}" && mount --bind "$node/run" /run/clowder && mount --bind "$node/spool" "$NODES_DIR/spool" &&
            mount --bind "$node/pmix" "$NODES_DIR/pmix" && mount -t sysfs sysfs "$node/sys" &&
            mount --bind "$node/sys/class/net" /sys/class/net && exec "$@"' sh "$NODES_DIR/n$1")
}
nodes_exec() { # K CMD...
    nodes_enter "$1"
    shift
    "${NODES_ENTER[@]}" "$@"
}
# A daemon in node K, in the background: $! is the daemon itself (nsenter, unshare and sh exec
# it), so nodes_down can stop it.
nodes_spawn() { # K LOG CMD...
    nodes_enter "$1"
    local log=$2
    shift 2
    "${NODES_ENTER[@]}" "$@" >>"$log" 2>&1 &
    NODES_PIDS+=($!)
}
export NODES_DIR

nodes_wait_for() { # SECONDS CMD...: until CMD succeeds; whether it did
    local tries=$(($1 * 10))
    shift
    while ! "$@" 2>/dev/null; do
        tries=$((tries - 1))
        [ $tries -gt 0 ] || return 1
        sleep 0.1
    done
}

nodes_clowderd() { # K
    nodes_spawn "$1" "$NODES_DIR/n$1/clowderd.log" "$CLOWDERD"
    nodes_wait_for 10 test -S "$NODES_DIR/n$1/run/clowderd.sock"
}

# Whether no enclave of any node's clowderd runs a job (CLOWDER: the clowder binary): a job whose
# clowder run was killed ends a moment later.
nodes_enclaves_idle() {
    local k
    for k in $(seq "$NODES_COUNT"); do
        [ -S "$NODES_DIR/n$k/run/clowderd.sock" ] || continue
        nodes_exec "$k" "$CLOWDER" enclave ls | awk '$11 ~ /^[0-9]+$/ && $11 > 0 {busy = 1} END {exit busy}' || return 1
    done
}

nodes_descendants() { # PID: its children's pids, theirs, ...
    local child
    for child in $(ps -o pid= --ppid "$1"); do echo "$child" && nodes_descendants "$child"; done
}

# CMD (mpirun, say), ended once it has run SECONDS: first the `clowder run`s among its
# descendants, so that the daemon kills their jobs and each enclave's kernel logs every thread of
# them (state, user RIP and stack: `clowder logs ENCLAVE`) while the launcher lives (a launcher
# killed first closes the ranks' PMIx sockets, and a rank may crash in its teardown and leave no
# report); what is left of CMD 10 s later. Also no job outlives CMD in an enclave to be shared
# with the next run (`timeout mpirun` leaves the ranks' `clowder run`s behind). CMD's status, or
# 124 when the limit ended it.
nodes_limited() { # SECONDS CMD...
    local limit=$1 start=$SECONDS cmd pid
    shift
    "$@" &
    cmd=$!
    while kill -0 $cmd 2>/dev/null && [ $((SECONDS - start)) -lt "$limit" ]; do sleep 0.5; done
    kill -0 $cmd 2>/dev/null || { wait $cmd; return; }
    for pid in $(nodes_descendants $cmd); do
        [ "$(ps -o comm= -p "$pid")" = clowder ] && kill -KILL "$pid" 2>/dev/null
    done
    start=$SECONDS
    while kill -0 $cmd 2>/dev/null && [ $((SECONDS - start)) -lt 10 ]; do sleep 0.5; done
    for pid in $(nodes_descendants $cmd) $cmd; do kill -KILL "$pid" 2>/dev/null; done
    wait $cmd 2>/dev/null # no "Killed" line
    return 124
}

nodes_sshd() {
    local d=$NODES_DIR/ssh k
    mkdir -p "$d" /run/sshd # sshd's privilege-separation directory
    ssh-keygen -q -t ed25519 -N '' -f "$d/host_key" && ssh-keygen -q -t ed25519 -N '' -f "$d/id" || return 1
    cp "$d/id.pub" "$d/authorized_keys"
    echo "* $(cat "$d/host_key.pub")" >"$d/known_hosts"
    printf '%s\n' "HostKey $d/host_key" "AuthorizedKeysFile $d/authorized_keys" "PermitRootLogin prohibit-password" \
        "PasswordAuthentication no" "KbdInteractiveAuthentication no" "UsePAM no" "StrictModes no" "PidFile none" >"$d/sshd_config"
    printf '%s\n' "IdentityFile $d/id" "IdentitiesOnly yes" "UserKnownHostsFile $d/known_hosts" \
        "StrictHostKeyChecking yes" "LogLevel ERROR" "BatchMode yes" >"$d/ssh_config"
    for k in $(seq "$NODES_COUNT"); do
        nodes_spawn "$k" "$d/sshd.log" /usr/sbin/sshd -D -e -f "$d/sshd_config" -o "ListenAddress=$(nodes_address "$k"):22"
    done
    NODES_SSH="ssh -F $d/ssh_config"
    for k in $(seq "$NODES_COUNT"); do
        nodes_wait_for 10 $NODES_SSH "$(nodes_address "$k")" true || { echo "nodes: no sshd answers in node $k" >&2; return 1; }
    done
}

nodes_slurm() {
    local d=$NODES_DIR k port=$((20000 + NODES_TAG % 20000))
    dd if=/dev/urandom of="$d/munge.key" bs=1024 count=1 2>/dev/null
    chmod 600 "$d/munge.key"
    munged --force --foreground --key-file="$d/munge.key" --socket="$d/munge.sock" --pid-file="$d/munged.pid" \
        --log-file="$d/munged.log" --seed-file="$d/munged.seed" 2>>"$d/munged.log" &
    NODES_PIDS+=($!)
    mkdir -p "$d/state"
    {
        echo "ClusterName=clowder$NODES_TAG"
        echo "SlurmctldHost=$(hostname -s)($(nodes_address 0))"
        echo "SlurmctldPort=$port"
        echo "SlurmdPort=$((port + 1))"
        echo "AuthType=auth/munge"
        echo "AuthInfo=socket=$d/munge.sock"
        echo "CredType=cred/munge"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "StateSaveLocation=$d/state"
        echo "SlurmdSpoolDir=$d/spool"
        echo "SlurmctldPidFile=$d/slurmctld.pid"
        echo "SlurmdPidFile=$d/slurmd.%n.pid"
        echo "SlurmctldLogFile=$d/slurmctld.log"
        echo "SlurmdLogFile=$d/slurmd.%n.log"
        echo "MailProg=/bin/true"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "SwitchType=switch/none"
        echo "MpiDefault=pmix"
        echo "ReturnToService=2"
        echo "SchedulerType=sched/builtin"
        echo "SelectType=select/linear"
        for k in $(seq "$NODES_COUNT"); do
            echo "NodeName=n$k NodeAddr=$(nodes_address "$k") CPUs=$(nproc) State=UNKNOWN"
        done
        echo "PartitionName=nodes Nodes=n[1-$NODES_COUNT] Default=YES MaxTime=INFINITE State=UP"
    } >"$d/slurm.conf"
    # Slurm's PMIx server names its sockets alike on every node: each node's own directory.
    echo "PMIxCliTmpDirBase=$d/pmix" >"$d/mpi.conf"
    export SLURM_CONF=$d/slurm.conf
    nodes_wait_for 5 test -S "$d/munge.sock" || { echo "nodes: munged did not start" >&2; return 1; }
    slurmctld -D -i -f "$SLURM_CONF" 2>>"$d/slurmctld.err" &
    NODES_PIDS+=($!)
    for k in $(seq "$NODES_COUNT"); do
        nodes_spawn "$k" "$d/slurmd.err" slurmd -D -N "n$k" -f "$SLURM_CONF"
    done
    nodes_idle() { [ "$(sinfo -h -o '%t %D')" = "idle $NODES_COUNT" ]; }
    nodes_wait_for 20 nodes_idle || { echo "nodes: the slurmds did not all register: $(sinfo 2>&1 | tail -3)" >&2; return 1; }
}

nodes_hugepages() { # PAGES; fails when the kernel cannot find them all
    local pool=/proc/sys/vm/nr_hugepages want
    want=$(($(cat $pool) + $1))
    echo "$want" >$pool 2>/dev/null
    NODES_HUGEPAGES=$((NODES_HUGEPAGES + $1))
    [ "$(cat $pool)" -ge "$want" ] || { echo "nodes.sh: the hugepage pool could not grow by $1 pages" >&2; return 1; }
}

nodes_down() {
    local p k
    for p in "${NODES_PIDS[@]}"; do kill "$p" 2>/dev/null; done
    wait "${NODES_PIDS[@]}" 2>/dev/null
    # Once the daemons (and their enclaves) are gone. Others may have changed the pool
    # meanwhile: only what was added is taken away.
    [ "$NODES_HUGEPAGES" = 0 ] || echo $(($(cat /proc/sys/vm/nr_hugepages) - NODES_HUGEPAGES)) >/proc/sys/vm/nr_hugepages
    NODES_HUGEPAGES=0
    ip link del "$NODES_BRIDGE" 2>/dev/null
    for k in $(seq "$NODES_COUNT"); do ip netns del "$(nodes_netns "$k")" 2>/dev/null; done
    rm -rf "$NODES_DIR"
}
