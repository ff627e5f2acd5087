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
trap 'stop_private_broker; rm -rf "$scratch"' EXIT
# From a copy: setuptools builds in the source directory, which stays untouched this way.
mkdir "$scratch/src"
cp -r "$here/pyproject.toml" "$here/README.md" "$here/clowder" "$scratch/src/"
python3 -m pip install -q --no-deps --no-build-isolation --disable-pip-version-check --target "$scratch/site" "$scratch/src" \
    >"$scratch/pip.log" 2>&1 || { cat "$scratch/pip.log" >&2; echo "python/test.sh: pip install ./python failed" >&2; exit 1; }
. "$root/scripts/private-broker.sh"
[ -n "${CLOWDER_XEMEM_SOCKET:-}" ] || start_private_broker "$scratch"
export CLOWDER_LIBXPMEM=$root/xemem/build/lib/libxpmem.so.0
# The installed copy, not the source tree: tests import clowder from the scratch site.
cd "$scratch"
PYTHONPATH=$scratch/site python3 -m pytest -q -p no:cacheprovider "$here/tests" "$@"
