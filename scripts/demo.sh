#!/usr/bin/env bash
# The main demo: a CG simulation (apps/hpccg) in a lightweight-kernel enclave on a dedicated
# core, next to the same binary on the host for comparison.
set -euo pipefail
cd "$(dirname "$0")/.."

make -s -C apps >/dev/null
vmm=target/release/clowder-vmm
lwk=kernels/target/x86_64-unknown-none/release/lwk
app=build/apps/hpccg
grid=(48 48 48)

if [ ! -e /dev/kvm ]; then
    echo "demo: /dev/kvm is missing: the enclave needs KVM" >&2
    exit 1
fi
last_core=$(( $(nproc) - 1 ))
echo "== hpccg ${grid[*]} in an LWK enclave (1 vCPU pinned to core $last_core, 512 MiB) =="
start=$(date +%s%N)
"$vmm" --kernel "$lwk" --module "$app" --mem 512M --cpus 1 --cores "$last_core" \
    --cmdline "-- hpccg ${grid[*]}"
echo "   enclave created, ran the job and was torn down in $(( ($(date +%s%N) - start) / 1000000 )) ms"
echo
echo "== the same binary on the host, same core =="
taskset -c "$last_core" "$app" "${grid[@]}"
