#!/bin/sh
# Builds kernels of this workspace (default: all of them) for x86_64-unknown-none, release
# profile, and prints the path of each image:
#   kernels/build.sh testguest  ->  kernels/target/x86_64-unknown-none/release/testguest
# Cargo rebuilds only what changed, so callers (the VMM's integration tests) may run it every time.
set -eu
cd "$(dirname "$0")"
if [ "$#" -eq 0 ]; then
    set -- testguest lwk
fi
for kernel in "$@"; do
    cargo build --quiet --release -p "$kernel"
    echo "$PWD/target/x86_64-unknown-none/release/$kernel"
done
