#!/usr/bin/env bash
# The Python package's tests: builds libxpmem, installs the package (pip, into a scratch
# directory: what `pip install ./python` does), starts a private XEMEM broker unless
# CLOWDER_XEMEM_SOCKET names one (xemem/test.sh passes its own), and runs pytest over
# python/tests against the installed copy. numpy and pytest come from scripts/bootstrap.sh.
set -euo pipefail
cd "$(dirname "$0")"
here=$(pwd)
root=$(cd .. && pwd)

make -s -C "$root/xemem" all >/dev/null
scratch=$(mktemp -d)
broker_pid=
trap '[ -z "$broker_pid" ] || kill "$broker_pid" 2>/dev/null; rm -rf "$scratch"' EXIT
# From a copy: setuptools builds in the source directory, which stays untouched this way.
mkdir "$scratch/src"
cp -r "$here/pyproject.toml" "$here/README.md" "$here/clowder" "$scratch/src/"
python3 -m pip install -q --no-deps --no-build-isolation --disable-pip-version-check --target "$scratch/site" "$scratch/src" \
    >"$scratch/pip.log" 2>&1 || { cat "$scratch/pip.log" >&2; echo "python/test.sh: pip install ./python failed" >&2; exit 1; }
if [ -z "${CLOWDER_XEMEM_SOCKET:-}" ]; then
    (cd "$root" && cargo build -q -p xemem-host --bin xemem-broker)
    target=$(cd "$root" && cargo metadata --format-version 1 --no-deps |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    export CLOWDER_XEMEM_SOCKET=$scratch/xemem.sock
    "$target/debug/xemem-broker" 2>"$scratch/broker.log" &
    broker_pid=$!
    for _ in $(seq 100); do [ -S "$CLOWDER_XEMEM_SOCKET" ] && break; sleep 0.05; done
fi
export CLOWDER_LIBXPMEM=$root/xemem/build/lib/libxpmem.so.0
# The installed copy, not the source tree: tests import clowder from the scratch site.
cd "$scratch"
PYTHONPATH=$scratch/site python3 -m pytest -q -p no:cacheprovider "$here/tests" "$@"
