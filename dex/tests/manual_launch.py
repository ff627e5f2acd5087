#!/usr/bin/env python3
"""Nodes started by hand, with address-space randomisation on, re-execute
themselves with it off and run together. Exit 0 if the program succeeds."""
import secrets
import sys

from by_hand import listener, start_node, wait_all

app = sys.argv[1]
origin_listen = listener()
port, fd = origin_listen.getsockname()[1], origin_listen.fileno()
secret = secrets.token_hex(32)  # the run's key, as dexrun would set it
procs = [start_node([app], node, port, fd, secret, aslr_off=False, stderr=None) for node in range(2)]
origin_listen.close()
codes = wait_all(procs, 30)
if codes is None:
    print("FAIL: timeout")
    sys.exit(1)
out = procs[0].stdout.read()
print(out, end="")
sys.exit(0 if codes == [0, 0] and "back on node 0: visits 1" in out else 1)
