#!/usr/bin/env bash
# Reads through an attachment of another enclave's memory cost what reads of the job's own
# memory cost, for the first attachment and for each fresh attachment of the same range after a
# detach: UCX's rendezvous between enclave ranks reads the peer's buffer so
# (lwk-only/attach_reread.c). A page fault into the LWK per page of an attachment (about 100 us
# each on PVM) would cost an 8 MiB read 200 ms. A private clowderd and two LWK enclaves; needs
# /dev/kvm, root (clowderd) and musl-gcc.
#
#   kernels/lwk/tests/xemem-attach-reread.sh     # KERNEL=, CLOWDER_VMM= override
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib/private-enclave.sh"
private_enclave_setup xemem-attach-reread "xemem attach reread"
build_musl_libxpmem
musl_job "$work/attach_reread" "$here/lwk-only/attach_reread.c"
owner=
on_exit='[ -n "$owner" ] && kill "$owner" 2>/dev/null; "$clowder" enclave rm rereadb >/dev/null 2>&1'
start_private_enclave rereada
"$clowder" enclave create --name rereadb --cores 1 --mem 128M >"$work/create-b.log" 2>&1 || fail "enclave create: $(cat "$work/create-b.log")"
(cd "$work" && timeout 150 "$clowder" run rereada ./attach_reread own) >"$work/owner.out" 2>&1 &
owner=$!
(cd "$work" && timeout 150 "$clowder" run rereadb ./attach_reread read) >"$work/reader.out" 2>&1
status=$?
# A reader that failed leaves no done mark: the owner would wait out its timeout.
[ "$status" = 0 ] || kill "$owner" 2>/dev/null
wait "$owner"
owner_status=$?
owner=
if [ "$status" = 0 ] && [ "$owner_status" = 0 ] && grep -q '^reads of an attachment cost what local reads cost' "$work/reader.out"; then
    echo "ok   xemem attach reread: $(grep '^8 MiB read' "$work/reader.out")"
else
    echo "FAIL xemem attach reread: reader status $status: $(tr '\n' ' ' <"$work/reader.out"); owner status $owner_status: $(tr '\n' ' ' <"$work/owner.out")"
    exit 1
fi
