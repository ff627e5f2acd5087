#!/usr/bin/env bash
# Counts the LWK kernel's emulated instructions while enclaves run, and says where they went.
#
# On a PVM host every guest kernel-mode instruction is emulated and the host's tracepoint
# kvm:kvm_emulate_insn fires once per instruction with its address: a window of it is an exact
# count of a kernel path, free of the machine's timing noise (docs/xemem.md, "Counting instead
# of timing"). Start the workload (e.g. a job that attaches in a loop), then:
#
#   scripts/lwk-kernel-profile.sh [SECONDS] [KERNEL_ELF]     # as root; default 0.05 s
#
# Prints the instructions counted, the functions that ran most of them, and the stretches
# between the channel's doorbells (the guest's port write, kvm_pio) and the host's interrupts
# (kvm_msi_set_irq): one stretch is typically one request's handling in the kernel.
set -euo pipefail
seconds=${1:-0.05}
[[ $seconds =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]] && awk -v s="$seconds" 'BEGIN { exit !(s > 0) }' ||
    { echo "lwk-kernel-profile: SECONDS must be a positive number, not '$seconds'" >&2; exit 2; }
here=$(cd "$(dirname "$0")/.." && pwd)
kernel=${2:-$here/kernels/target/x86_64-unknown-none/release/lwk}
tracing=/sys/kernel/tracing
events="kvm/kvm_emulate_insn kvm/kvm_pio kvm/kvm_msi_set_irq"
[ -w "$tracing/trace" ] || { echo "lwk-kernel-profile: needs root and tracefs at $tracing" >&2; exit 2; }
[ -e "$tracing/events/kvm/kvm_emulate_insn" ] || { echo "lwk-kernel-profile: this kernel has no kvm:kvm_emulate_insn tracepoint" >&2; exit 2; }
[ -f "$kernel" ] || { echo "lwk-kernel-profile: no kernel ELF at $kernel (make kernels)" >&2; exit 2; }
command -v addr2line >/dev/null || { echo "lwk-kernel-profile: addr2line (binutils) is missing" >&2; exit 2; }

out=$(mktemp)
was_on=$(cat "$tracing/tracing_on")
buffer=$(cat "$tracing/buffer_size_kb")
cleanup() {
	for event in $events; do echo 0 >"$tracing/events/$event/enable"; done
	echo "$buffer" >"$tracing/buffer_size_kb"
	echo "$was_on" >"$tracing/tracing_on"
	rm -f "$out"
}
trap cleanup EXIT
echo 30000 >"$tracing/buffer_size_kb"
echo >"$tracing/trace"
echo 1 >"$tracing/tracing_on"
for event in $events; do echo 1 >"$tracing/events/$event/enable"; done
sleep "$seconds"
for event in $events; do echo 0 >"$tracing/events/$event/enable"; done
cp "$tracing/trace" "$out"

python3 - "$out" "$kernel" <<'PYTHON'
import collections, re, subprocess, sys
trace, kernel = sys.argv[1], sys.argv[2]
stretches, marks = [[]], []
for line in open(trace):
    found = re.search(r"kvm_emulate_insn: 0:([0-9a-f]+):", line)
    if found:
        stretches[-1].append(int(found.group(1), 16))
    elif "kvm_pio:" in line or "kvm_msi_set_irq:" in line:
        marks.append("doorbell" if "kvm_pio:" in line else "interrupt")
        stretches.append([])
addresses = sorted({a for s in stretches for a in s})
if not addresses:
    sys.exit("lwk-kernel-profile: no emulated instructions in the window (is an enclave running kernel code?)")
names = subprocess.run(["addr2line", "-f", "-C", "-e", kernel] + [hex(a) for a in addresses],
                       capture_output=True, text=True, check=True).stdout.splitlines()[0::2]
function = {a: re.sub(r"<.*?>", "", n)[:90] for a, n in zip(addresses, names)}
total = sum(len(s) for s in stretches)
print(f"{total} emulated kernel instructions in the window, {len(marks)} doorbells and interrupts")
print("\nby function:")
counts = collections.Counter(function[a] for s in stretches for a in s)
for name, count in counts.most_common(25):
    print(f"{count:8d}  {name}")
print("\nstretches (instructions, then what ended them):")
for stretch, mark in zip(stretches, marks + ["end of window"]):
    if stretch:
        print(f"{len(stretch):8d}  then {mark}")
PYTHON
