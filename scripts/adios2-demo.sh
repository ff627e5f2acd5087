#!/usr/bin/env bash
# In-situ analytics through ADIOS2 over XEMEM: a CG-like simulation (C++, ADIOS2's C++ API)
# publishes its solution vector every INTERVAL iterations; Python analytics read each step
# through ADIOS2's Python API. Both select the clowder engine in the same XML configuration
# (engine type "Plugin", PluginName clowder), so each step crosses as one XEMEM segment that
# the reader attaches, with no copy in between.
#   scripts/adios2-demo.sh [NX NY NZ ITERATIONS INTERVAL]     (default 32 32 32 200 20)
# Uses the running clowderd's broker when there is one, else starts a private one.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

usage() { echo "usage: scripts/adios2-demo.sh [NX NY NZ ITERATIONS INTERVAL]" >&2; exit 2; }
if [ $# -ne 0 ] && [ $# -ne 5 ]; then usage; fi
names=(NX NY NZ ITERATIONS INTERVAL)
args=("${@:-}")
[ $# -eq 0 ] && args=(32 32 32 200 20)
for i in 0 1 2 3 4; do
    if ! [[ ${args[$i]} =~ ^[1-9][0-9]*$ ]]; then
        echo "adios2-demo: ${names[$i]} must be a whole number from 1 up, not '${args[$i]}'" >&2
        exit 2
    fi
done

scripts/adios2-setup.sh
scratch=$(mktemp -d)
chmod 0755 "$scratch"
. scripts/private-broker.sh
trap 'stop_private_broker; rm -rf "$scratch"' EXIT
default_socket=${CLOWDER_XEMEM_SOCKET:-/run/clowder/xemem.sock}
if [ -S "$default_socket" ]; then
    export CLOWDER_XEMEM_SOCKET=$default_socket
else
    start_private_broker "$scratch"
fi

cat >"$scratch/adios2.xml" <<XML
<?xml version="1.0"?>
<adios-config>
  <io name="SimulationOutput">
    <engine type="Plugin">
      <parameter key="PluginName" value="clowder"/>
      <parameter key="PluginLibrary" value="$root/build/adios2/build/libclowder_adios2.so"/>
      <parameter key="QueueLimit" value="2"/>
    </engine>
  </io>
</adios-config>
XML
echo "adios2-demo: cg_sim ${args[*]} -> ADIOS2 (clowder engine over XEMEM) -> Python analytics"
export PYTHONPATH=$root/build/adios2/py
"$root/build/adios2/build/cg_sim" "$scratch/adios2.xml" "${args[@]}" &
sim=$!
status=0
python3 "$root/coupling/adios2/demo/analytics.py" "$scratch/adios2.xml" || status=$?
wait $sim || status=$?
exit $status
