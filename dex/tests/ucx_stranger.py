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

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
HEADER = struct.Struct("<HHHHII")
MAGIC, PAGE_REQUEST = 0xDE58, 3
SECRET = secrets.token_hex(32)


def start(node, port, fd):
    env = {"PATH": "/usr/bin:/bin", "GLIBC_TUNABLES": "glibc.pthread.rseq=0", "DEX_RUN_SECRET": SECRET,
           "DEX_TRANSPORT": "ucx",
           "DEX_BOOT": "node=%03d,nodes=002,port=%05d,fd=%04d,host=127.000.000.001" % (node, port, fd)}
    return subprocess.Popen(["setarch", "x86_64", "-R", BUILD + "/coherence", "pingpong", "2", "2000"], env=env,
                            pass_fds=(fd,), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


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


def listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    return s


def main(scratch):
    origin_listen, relay_listen = listener(), listener()
    origin_port, relay_port = origin_listen.getsockname()[1], relay_listen.getsockname()[1]
    fd = origin_listen.fileno()
    origin = start(0, origin_port, fd)
    node = start(1, relay_port, fd)
    origin_listen.close()
    from_node, _ = relay_listen.accept()
    to_origin = socket.create_connection(("127.0.0.1", origin_port))
    from_node.sendall(recv_exact(to_origin, 40))  # challenge
    to_origin.sendall(recv_exact(from_node, 64))  # proof
    from_node.sendall(recv_exact(to_origin, 32))  # answer
    to_origin.sendall(recv_exact(from_node, HEADER.size + 80))  # HELLO
    from_node.sendall(recv_exact(to_origin, HEADER.size + 8))  # WELCOME
    length = recv_exact(to_origin, 4)
    address = recv_exact(to_origin, struct.unpack("<I", length)[0])
    from_node.sendall(length + address)
    threading.Thread(target=relay, args=(to_origin, from_node), daemon=True).start()
    threading.Thread(target=relay, args=(from_node, to_origin), daemon=True).start()

    address_file, message_file = os.path.join(scratch, "address"), os.path.join(scratch, "message")
    with open(address_file, "wb") as f:
        f.write(address)
    bogus = struct.pack("<QII", 0x1000, 1, 0)
    with open(message_file, "wb") as f:
        f.write(HEADER.pack(MAGIC, PAGE_REQUEST, 1, 0, len(bogus), 999) + bogus)
    time.sleep(0.3)
    stranger = subprocess.run([BUILD + "/ucx_stranger", address_file, message_file, "1"], capture_output=True,
                              text=True, timeout=20)
    try:
        codes = [origin.wait(timeout=100), node.wait(timeout=100)]
    except subprocess.TimeoutExpired:
        origin.kill()
        node.kill()
        codes = None
    out, err = origin.stdout.read(), origin.stderr.read() + node.stderr.read()
    sys.stdout.write(stranger.stdout + stranger.stderr + out + err)
    checks = [
        ("the stranger reached the origin's worker", stranger.returncode == 0),
        ("its message dropped with a log line", "dropped a message tagged 0x1, not from a node of this run" in err),
        ("the run finished correctly", codes == [0, 0] and "PASS pingpong" in out),
    ]
    ok = True
    for name, passed in checks:
        print("%s %s" % ("ok  " if passed else "FAIL", name))
        ok = ok and passed
    return 0 if ok else 1


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        sys.exit(main(d))
