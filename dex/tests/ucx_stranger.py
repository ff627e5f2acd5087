#!/usr/bin/env python3
"""A stranger who has found the origin's UCX worker address, but not the
run's secret, cannot inject messages into a UCX run.

Starts an origin and one node by hand over DEX_TRANSPORT=ucx, with a relay
on the node's bootstrap connection that passes everything through and keeps
a copy of the origin's UCX address. Mid-run, build/ucx_stranger sends the
origin a PAGE_REQUEST tagged as node 1 tagged before (its bare node number):
the origin must drop it with a log line and the run must finish correctly
(before, the origin took it as node 1's and stopped the run). Usage:
tests/ucx_stranger.py BUILD_DIR; exit 0 if so."""
import os
import secrets
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

from by_hand import bogus_page_request, listener, pass_join, recv_exact, relay, report, start_node, wait_all

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
SECRET = secrets.token_hex(32)


def start(node, port, fd):
    return start_node([BUILD + "/coherence", "pingpong", "2", "2000"], node, port, fd, SECRET,
                      env={"DEX_TRANSPORT": "ucx"})


def main(scratch):
    origin_listen, relay_listen = listener(), listener()
    origin_port, relay_port = origin_listen.getsockname()[1], relay_listen.getsockname()[1]
    fd = origin_listen.fileno()
    origin = start(0, origin_port, fd)
    node = start(1, relay_port, fd)
    origin_listen.close()
    from_node, _ = relay_listen.accept()
    to_origin = socket.create_connection(("127.0.0.1", origin_port))
    pass_join(from_node, to_origin)
    length = recv_exact(to_origin, 4)
    address = recv_exact(to_origin, struct.unpack("<I", length)[0])
    from_node.sendall(length + address)
    threading.Thread(target=relay, args=(to_origin, from_node), daemon=True).start()
    threading.Thread(target=relay, args=(from_node, to_origin), daemon=True).start()

    address_file, message_file = os.path.join(scratch, "address"), os.path.join(scratch, "message")
    with open(address_file, "wb") as f:
        f.write(address)
    with open(message_file, "wb") as f:
        f.write(bogus_page_request())
    time.sleep(0.3)
    stranger = subprocess.run([BUILD + "/ucx_stranger", address_file, message_file, "1"], capture_output=True,
                              text=True, timeout=20)
    codes = wait_all([origin, node], 100)
    out, err = origin.stdout.read(), origin.stderr.read() + node.stderr.read()
    sys.stdout.write(stranger.stdout + stranger.stderr + out + err)
    return report([
        ("the stranger reached the origin's worker", stranger.returncode == 0),
        ("its message dropped with a log line", "dropped a message tagged 0x1, not from a node of this run" in err),
        ("the run finished correctly", codes == [0, 0] and "PASS pingpong" in out),
    ])


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        sys.exit(main(d))
