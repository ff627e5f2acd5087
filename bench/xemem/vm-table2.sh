#!/usr/bin/env bash
# XEMEM Table 2's Linux-VM rows (issue 26): boots a Linux enclave under a private clowderd
# (node/clowderd/tests/xemem_linux_vm.rs, vm_attach_bench) and measures host -> VM, LWK -> VM,
# VM -> host and VM -> LWK with attach_bench, RUNS times each (a new segment each run), then
# writes the tables into docs/results/xemem-attach.md (between its vm-table2 markers) and draws
# docs/results/xemem-vm.png (bench/xemem/vm_table2.py). An hour or more on a PVM host: the
# guest's kernel code is emulated. Settings (environment): SIZES (MiB, default "128 256 512
# 1024"), RUNS (3), ATTACHES (10), READS (5), VM_OWNER_MAX (MiB a VM owner exports at most,
# default 1024, 0 for none: its pages are first touched in emulated guest kernel code, written
# once for all its segments; the VM gets that much more memory), LWK (1: the LWK rows),
# LOCAL_MIB (the VM attachers' local buffer, default 256: a tmpfs file in the guest allocated by
# the first job, about 30 minutes a GiB, and mapped by each later one in a few), HUGEPAGES (1,
# the default: the VM's and the LWK's RAM on 2 MiB pages, as the host owner's; 0: 4 KiB),
# BACKINGS (2m: the host owner's pages). Two VMs are booted in turn, the second for the
# VM-owner rows (see below). LOG=FILE keeps the benchmark's output there (the second VM's in
# FILE.owners). NO_WRITE=1 prints the tables only. If the benchmark fails, the tables of what
# it measured are still made (the rest marked as not measured) and the script exits with its
# status.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ $# -gt 0 ]; then
    echo "vm-table2: takes no arguments (settings are environment variables), got '$1'" >&2
    exit 2
fi
for setting in SIZES RUNS ATTACHES READS LOCAL_MIB; do
    for value in ${!setting:-1}; do
        if ! [[ $value =~ ^[1-9][0-9]*$ ]]; then
            echo "vm-table2: $setting must be whole numbers from 1 up, not '$value'" >&2
            exit 2
        fi
    done
done
for backing in ${BACKINGS-2m}; do
    if [ "$backing" != 4k ] && [ "$backing" != 2m ]; then
        echo "vm-table2: BACKINGS takes 4k and 2m (or nothing: no host -> VM rows), not '$backing'" >&2
        exit 2
    fi
done
if ! [[ ${VM_OWNER_MAX:-0} =~ ^[0-9]+$ ]]; then
    echo "vm-table2: VM_OWNER_MAX is a size in MiB (0: no VM owner rows), not '$VM_OWNER_MAX'" >&2
    exit 2
fi
if [ ! -c /dev/kvm ]; then
    echo "vm-table2: no /dev/kvm: the Linux-VM rows are not measured here"
    exit 0
fi
if [ -n "${LOG:-}" ]; then
    log=$LOG
else
    log_dir=$(mktemp -d)
    trap 'rm -rf "$log_dir"' EXIT
    log=$log_dir/vm-bench.log
fi
started=$(date -u '+%Y-%m-%d %H:%M UTC')
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
echo "vm-table2: $started, $(nproc) CPUs, load $load_before"
t0=$(date +%s)
export SIZES=${SIZES:-128 256 512 1024} VM_OWNER_MAX=${VM_OWNER_MAX:-1024} LWK=${LWK:-1} BACKINGS=${BACKINGS-2m}
status=0
export RUNS=${RUNS:-3} ATTACHES=${ATTACHES:-10} READS=${READS:-5} CLOWDER_LINUX_HOST_FILES=0
bench() {
    cargo test --release -p clowderd --test xemem_linux_vm -- --ignored --nocapture vm_attach_bench 2>&1 | tee "$1" || status=$?
}
# Two VMs, one after the other. The directions into the VM first, in a VM whose RAM is on 2 MiB
# pages as the host owner's segments are (HUGEPAGES). Then the VM-owner rows, in a VM on 4 KiB
# pages: a guest exports 4 KiB frames scattered over its RAM, which a host process can map only
# from 4 KiB pages (clowderd refuses partial hugepages: owner_runs.rs, WholePagesOnly).
logs=("$log")
VM_OWNER_MAX=0 bench "$log"
owned=$(for mib in $SIZES; do if [ "$mib" -le "$VM_OWNER_MAX" ]; then echo "$mib"; fi; done | xargs)
if [ -n "$owned" ] && [ "$status" = 0 ]; then
    logs+=("$log.owners")
    SIZES=$owned VM_ATTACHER=0 HUGEPAGES=0 BACKINGS= bench "$log.owners"
fi
args=(--date "$started" --load-before "$load_before" --load-after "$(cut -d' ' -f1-3 /proc/loadavg)"
    --elapsed $(( $(date +%s) - t0 )) --commit "$(git rev-parse --short HEAD)"
    --machine "$(uname -r), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs"
    --sizes "$SIZES" --vm-owner-max "$VM_OWNER_MAX" --lwk "$LWK" --backings "$BACKINGS")
if [ "${NO_WRITE:-0}" = 1 ]; then
    python3 bench/xemem/vm_table2.py "${logs[@]}" "${args[@]}"
else
    python3 -c 'import matplotlib' 2>/dev/null || pip install -q matplotlib 2>/dev/null ||
        pip install -q --break-system-packages matplotlib
    python3 bench/xemem/vm_table2.py "${logs[@]}" "${args[@]}" --write docs/results/xemem-attach.md --figure docs/results/xemem-vm.png
fi
exit $status
