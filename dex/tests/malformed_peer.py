#!/usr/bin/env python3
"""Malformed and unexpected messages are rejected.

Starts an origin and one node by hand (as dexrun would), with a relay
between them. Before the node joins, a stranger connects to the origin and
sends garbage: the origin must log the rejection and keep waiting. After the
node has joined, the relay injects a PAGE_REQUEST for an address outside the
shared regions (the relay passed the authentication through, as an attacker
on the path could): the origin must reject it, stop, and the node must report
the lost connection. Exit status 0 when all of that happens within 10 s."""
import secrets
import socket
import subprocess
import sys
import threading
import time

from by_hand import bogus_page_request, listener, pass_join, relay, report, start_node, wait_all

APP = sys.argv[1]
SECRET = secrets.token_hex(32)


def start(node, port, fd):
    return start_node([APP, "pingpong", "2", "100000000"], node, port, fd, SECRET, stdout=subprocess.DEVNULL)


def main():
    origin_listen = listener()
    origin_port = origin_listen.getsockname()[1]
    relay_listen = listener()
    relay_port = relay_listen.getsockname()[1]
    fd = origin_listen.fileno()
    origin = start(0, origin_port, fd)

    stranger = socket.create_connection(("127.0.0.1", origin_port))
    stranger.sendall(b"GET / HTTP/1.0\r\n\r\n")
    stranger.close()

    node = start(1, relay_port, fd)
    origin_listen.close()
    from_node, _ = relay_listen.accept()
    to_origin = socket.create_connection(("127.0.0.1", origin_port))
    pass_join(from_node, to_origin)
    threading.Thread(target=relay, args=(to_origin, from_node), daemon=True).start()
    time.sleep(0.5)
    to_origin.sendall(bogus_page_request())

    codes = wait_all([origin, node], 10)
    if codes is None:
        print("FAIL: processes still running 10 s after the malformed message")
        return 1
    origin_rc, node_rc = codes
    origin_err, node_err = origin.stderr.read(), node.stderr.read()
    sys.stderr.write(origin_err + node_err)
    return report([
        ("stranger rejected", "rejected a joining connection" in origin_err),
        ("bad request rejected", "rejected PAGE_REQUEST" in origin_err),
        ("origin failed", origin_rc != 0),
        ("node reported it", "lost connection to the origin" in node_err and node_rc != 0),
    ])


if __name__ == "__main__":
    sys.exit(main())
