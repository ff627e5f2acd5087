#!/usr/bin/env bash
# DEX under a PMIx launcher (Open MPI's mpirun): rank 0 is the origin, the
# ranks find it through PMIx (no dexrun, no DEX_BOOT), every connection
# proves DEX_RUN_SECRET, which mpirun passes to all ranks with -x.
#   1. 2 ranks: a thread visits node 1 and comes back (TCP);
#   2. 3 ranks: a mutex counter across nodes;
#   3. 3 ranks over UCX (when built), the workers' addresses through PMIx;
#   4. no DEX_RUN_SECRET: every rank refuses to start, naming it;
#   5. rank 1 with another secret cannot join: the origin refuses it.
# Usage: tests/pmix_mpirun.sh BUILD. Exit status non-zero if any fails.
set -u
BUILD=$(cd "${1:-build}" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=0
check() { # description command...
	local what=$1
	shift
	if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; sed 's/^/    /' "$scratch/out" | tail -15; failed=1; fi
}
# as root, on 2 cores: more ranks than cores
launch() { timeout 90 mpirun --allow-run-as-root --oversubscribe "$@" >"$scratch/out" 2>&1; }
DEX_RUN_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
export DEX_RUN_SECRET

two_ranks() { launch -n 2 -x DEX_RUN_SECRET "$BUILD/hello_nodes" && grep -q "back on node 0: visits 1" "$scratch/out"; }
check "2 ranks: the thread visits rank 1 and comes back" two_ranks

three_ranks() { launch -n 3 -x DEX_RUN_SECRET "$BUILD/coherence" mutex 6 300 && grep -q "PASS mutex" "$scratch/out"; }
check "3 ranks: mutex counter right" three_ranks

if [ -f "$BUILD/libdex-ucx.so" ]; then
	ucx() {
		DEX_TRANSPORT=ucx CLOWDER_LOG=debug launch -n 3 -x DEX_RUN_SECRET -x DEX_TRANSPORT -x CLOWDER_LOG \
			"$BUILD/coherence" mutex 6 300 && grep -q "PASS mutex" "$scratch/out" &&
			[ "$(grep -c "UCX: workers' addresses from the launcher (PMIx)" "$scratch/out")" = 3 ]
	}
	check "3 ranks over UCX, the workers' addresses carried by PMIx" ucx
fi

no_secret() {
	! env -u DEX_RUN_SECRET timeout 90 mpirun --allow-run-as-root --oversubscribe -n 2 "$BUILD/hello_nodes" \
		>"$scratch/out" 2>&1 &&
		[ "$(grep -c "DEX_RUN_SECRET: it is not set" "$scratch/out")" = 2 ] && ! grep -q "back on node" "$scratch/out"
}
check "without DEX_RUN_SECRET no rank starts, each says why" no_secret

# rank 1 gets another secret: PMIx tells it where the origin is, but it
# cannot prove the run's secret
cat >"$scratch/impostor" <<'SH'
#!/bin/sh
[ "$PMIX_RANK" = 1 ] && DEX_RUN_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
exec "$@"
SH
chmod +x "$scratch/impostor"
impostor() {
	! DEX_JOIN_TIMEOUT=5 launch -n 2 -x DEX_RUN_SECRET -x DEX_JOIN_TIMEOUT "$scratch/impostor" "$BUILD/hello_nodes" &&
		grep -q "dex\[node 0\]: rejected a joining connection: wrong secret" "$scratch/out" &&
		grep -q "dex\[node 1\]: error: cannot join the origin" "$scratch/out" && ! grep -q "back on node" "$scratch/out"
}
check "a rank with another secret cannot join; the origin names the refusal" impostor
exit $failed
