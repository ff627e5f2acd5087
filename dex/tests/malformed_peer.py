#!/usr/bin/env python3
"""Malformed and unexpected messages are rejected.

Starts an origin and one node by hand (as dexrun would), with a relay
between them. Before the node joins, a stranger connects to the origin and
sends garbage: the origin must log the rejection and keep waiting. After the
node has joined, the relay injects a PAGE_REQUEST for an address outside the
shared regions (the relay passed the authentication through, as an attacker
on the path could): the origin must reject it, stop, and the node must report
the lost connection. Exit status 0 when all of that happens within 10 s."""
import os
import secrets
import socket
import struct
import subprocess
import sys
import threading
import time

APP = sys.argv[1]
HEADER = struct.Struct("<HHHHII")
MAGIC, PAGE_REQUEST = 0xDE58, 3
SECRET = secrets.token_hex(32)


def listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    return s


def start(node, port, fd):
    env = {
        "PATH": "/usr/bin:/bin",
        "GLIBC_TUNABLES": "glibc.pthread.rseq=0",
        "DEX_RUN_SECRET": SECRET,
        "DEX_BOOT": "node=%03d,nodes=002,port=%05d,fd=%04d,host=127.000.000.001" % (node, port, fd),
    }
    return subprocess.Popen(["setarch", "x86_64", "-R", APP, "pingpong", "2", "100000000"], env=env,
                            pass_fds=(fd,), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)


def recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def relay(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


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
    # the relay passes the authentication through: challenge, proof, answer
    from_node.sendall(recv_exact(to_origin, 40))
    to_origin.sendall(recv_exact(from_node, 64))
    from_node.sendall(recv_exact(to_origin, 32))
    hello = recv_exact(from_node, HEADER.size + 80)
    to_origin.sendall(hello)
    welcome = recv_exact(to_origin, HEADER.size + 8)
    from_node.sendall(welcome)
    threading.Thread(target=relay, args=(to_origin, from_node), daemon=True).start()
    time.sleep(0.5)
    # A page request naming an address no region contains, from node 1.
    bogus = struct.pack("<QII", 0x1000, 1, 0)
    to_origin.sendall(HEADER.pack(MAGIC, PAGE_REQUEST, 1, 0, len(bogus), 999) + bogus)

    ok = True
    try:
        origin_rc = origin.wait(timeout=10)
        node_rc = node.wait(timeout=10)
    except subprocess.TimeoutExpired:
        origin.kill()
        node.kill()
        print("FAIL: processes still running 10 s after the malformed message")
        return 1
    origin_err, node_err = origin.stderr.read(), node.stderr.read()
    sys.stderr.write(origin_err + node_err)
    checks = [
        ("stranger rejected", "rejected a joining connection" in origin_err),
        ("bad request rejected", "rejected PAGE_REQUEST" in origin_err),
        ("origin failed", origin_rc != 0),
        ("node reported it", "lost connection to the origin" in node_err and node_rc != 0),
    ]
    for name, passed in checks:
        print("%s %s" % ("ok  " if passed else "FAIL", name))
        ok = ok and passed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
