#!/usr/bin/env python3
"""The VMM's share of a host -> LWK attach: how long a running enclave's clowder-vmm takes to add
and remove a guest-physical region over a memfd, asked on its control socket exactly as clowderd
asks it for every attach and detach of host memory (one JSON line, the memfd by SCM_RIGHTS).

    region_bench.py CONTROL_SOCKET 4k|2m MIB ITERATIONS

The memfd is filled first (as an owner's memory is). The guest is never told about the region
and never touches it. Prints: BACKING MIB ITERATIONS ADD_MEDIAN_US REMOVE_MEDIAN_US
"""
import json
import os
import socket
import statistics
import sys
import time


def fail(message):
    sys.exit(f"region_bench: {message}")


def call(connection, stream, request, fds=()):
    line = (json.dumps(request) + "\n").encode()
    if fds:
        socket.send_fds(connection, [line], list(fds))
    else:
        connection.sendall(line)
    reply = stream.readline()
    if not reply:
        fail("the VMM closed its control socket")
    answer = json.loads(reply)
    if answer.get("ok") is False or "error" in answer:
        fail(f"{request['op']}: {answer}")
    return answer


def main(arguments):
    if len(arguments) != 4 or arguments[1] not in ("4k", "2m") or not arguments[2].isdigit() or not arguments[3].isdigit():
        fail("usage: region_bench.py CONTROL_SOCKET 4k|2m MIB ITERATIONS")
    path, backing, mib, iterations = arguments[0], arguments[1], int(arguments[2]), int(arguments[3])
    if not 1 <= mib <= 65536 or not 1 <= iterations <= 100000:
        fail("MIB must be 1..65536 and ITERATIONS 1..100000")
    size = mib << 20
    flags = os.MFD_CLOEXEC | (os.MFD_HUGETLB | os.MFD_HUGE_2MB if backing == "2m" else 0)
    try:
        memory = os.memfd_create("region-bench", flags)
        os.ftruncate(memory, size)
        os.posix_fallocate(memory, 0, size)
    except OSError as e:
        fail(f"a {mib} MiB {backing} memfd: {e} (2m needs free hugepages)")
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
    except OSError as e:
        fail(f"{path}: {e}")
    stream = connection.makefile("rb")
    adds, removes = [], []
    for _ in range(iterations):
        started = time.perf_counter()
        added = call(connection, stream, {"op": "add_region", "offset": 0, "len": size}, [memory])
        adds.append(time.perf_counter() - started)
        slot = added.get("slot")
        if not isinstance(slot, int):
            fail(f"add_region answered without a slot: {added}")
        started = time.perf_counter()
        call(connection, stream, {"op": "remove_region", "slot": slot})
        removes.append(time.perf_counter() - started)
    print(f"{backing} {mib} {iterations} {statistics.median(adds) * 1e6:.1f} {statistics.median(removes) * 1e6:.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
