#!/usr/bin/env bash
# Installs ADIOS2 2.12 from PyPI (the wheel: shared libraries, headers, its CMake package and
# the Python bindings, with numpy) into build/adios2/py, once, and builds the clowder plugin
# engine and its test programs against it into build/adios2/build. Quiet when all is there.
# Prints nothing on success; the plugin is build/adios2/build/libclowder_adios2.so.
# Used by coupling/adios2/test.sh, scripts/adios2-demo.sh and coupling/bench/run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
py=$root/build/adios2/py
version='2.12.*'
stamp=$py/.installed-$(echo "$version" | tr -d '*')

if [ ! -f "$stamp" ]; then
    echo "adios2-setup: installing adios2==$version from PyPI into build/adios2/py" >&2
    rm -rf "$py"
    python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
        --root-user-action=ignore \
        --target "$py" "adios2==$version" >&2
    touch "$stamp"
fi
make -s -C xemem all >/dev/null
mkdir -p build/adios2/build
cd build/adios2/build
if [ ! -f Makefile ]; then
    cmake -S "$root/coupling/adios2" -B . -DCMAKE_BUILD_TYPE=Release \
        -DADIOS2_DIR="$py/adios2/cmake/adios2" -DXEMEM_DIR="$root/xemem/build" >/dev/null
fi
cmake --build . -j 2 >/dev/null
