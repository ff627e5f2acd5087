#!/usr/bin/env python3
"""Nodes started by hand, with address-space randomisation on, re-execute
themselves with it off and run together. Exit 0 if the program succeeds."""
import secrets
import socket
import subprocess
import sys

app = sys.argv[1]
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(4)
port, fd = listener.getsockname()[1], listener.fileno()
procs = []
secret = secrets.token_hex(32)  # the run's key, as dexrun would set it
for node in range(2):
    env = {"PATH": "/usr/bin:/bin", "GLIBC_TUNABLES": "glibc.pthread.rseq=0", "DEX_RUN_SECRET": secret,
           "DEX_BOOT": "node=%03d,nodes=002,port=%05d,fd=%04d,host=127.000.000.001" % (node, port, fd)}
    procs.append(subprocess.Popen([app], env=env, pass_fds=(fd,), stdout=subprocess.PIPE, text=True))
listener.close()
try:
    codes = [p.wait(timeout=30) for p in procs]
except subprocess.TimeoutExpired:
    for p in procs:
        p.kill()
    print("FAIL: timeout")
    sys.exit(1)
out = procs[0].stdout.read()
print(out, end="")
sys.exit(0 if codes == [0, 0] and "back on node 0: visits 1" in out else 1)
