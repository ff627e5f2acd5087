#!/usr/bin/env python3
"""A node running a different binary (so a different address-space layout)
is refused at HELLO: the origin names the reason, the node reports the
refusal, and the origin gives up when no valid node joins. Exit 0 if so."""
import secrets
import subprocess
import sys

from by_hand import listener, start_node, wait_all

origin_app, node_app = sys.argv[1], sys.argv[2]
origin_listen = listener()
port, fd = origin_listen.getsockname()[1], origin_listen.fileno()
secret = secrets.token_hex(32)  # the run's key, as dexrun would set it
procs = [start_node([app], node, port, fd, secret, env={"DEX_JOIN_TIMEOUT": "2"}, stdout=subprocess.DEVNULL)
         for node, app in ((0, origin_app), (1, node_app))]
origin_listen.close()
codes = wait_all(procs, 20)
if codes is None:
    print("FAIL: timeout")
    sys.exit(1)
origin_err, node_err = procs[0].stderr.read(), procs[1].stderr.read()
print(origin_err + node_err, end="")
ok = (codes[0] != 0 and codes[1] != 0 and "address-space layout differs" in origin_err
      and "joined within 2 s" in origin_err and "rejected this node" in node_err)
sys.exit(0 if ok else 1)
