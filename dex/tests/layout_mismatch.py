#!/usr/bin/env python3
"""A node running a different binary (so a different address-space layout)
is refused at HELLO: the origin names the reason, the node reports the
refusal, and the origin gives up when no valid node joins. Exit 0 if so."""
import secrets
import socket
import subprocess
import sys

origin_app, node_app = sys.argv[1], sys.argv[2]
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(4)
port, fd = listener.getsockname()[1], listener.fileno()
procs = []
secret = secrets.token_hex(32)  # the run's key, as dexrun would set it
for node, app in ((0, origin_app), (1, node_app)):
    env = {"PATH": "/usr/bin:/bin", "GLIBC_TUNABLES": "glibc.pthread.rseq=0", "DEX_RUN_SECRET": secret, "DEX_JOIN_TIMEOUT": "2",
           "DEX_BOOT": "node=%03d,nodes=002,port=%05d,fd=%04d,host=127.000.000.001" % (node, port, fd)}
    procs.append(subprocess.Popen(["setarch", "x86_64", "-R", app], env=env, pass_fds=(fd,),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
listener.close()
try:
    codes = [p.wait(timeout=20) for p in procs]
except subprocess.TimeoutExpired:
    for p in procs:
        p.kill()
    print("FAIL: timeout")
    sys.exit(1)
origin_err, node_err = procs[0].stderr.read(), procs[1].stderr.read()
print(origin_err + node_err, end="")
ok = (codes[0] != 0 and codes[1] != 0 and "address-space layout differs" in origin_err
      and "joined within 2 s" in origin_err and "rejected this node" in node_err)
sys.exit(0 if ok else 1)
