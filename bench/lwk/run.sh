#!/usr/bin/env bash
# Issue 3's benchmarks: the same static binaries on the host and in an LWK enclave.
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s -C apps >/dev/null
target/release/lwk-bench
