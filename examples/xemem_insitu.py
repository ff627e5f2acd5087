#!/usr/bin/env python3
"""In-situ analytics over XEMEM from Python, step by step (a notebook-style script: each
`# %%` cell runs on its own in Jupyter or VS Code, top to bottom).

A "simulation" keeps its field in a region (shared memory), and at every step publishes a
copy-on-write snapshot of it under a name. An "analytics" process attaches the snapshot with
no copy, reduces it, and signals the simulation when done, while the simulation already
computes the next step into the same memory: the snapshot does not change under the reader.

Run it where a broker is (clowderd, or xemem/test.sh's standalone `xemem-broker`):

    make -C xemem && pip install ./python
    CLOWDER_LIBXPMEM=$PWD/xemem/build/lib/libxpmem.so.0 python3 examples/xemem_insitu.py

(CLOWDER_XEMEM_SOCKET names the broker's socket when it is not clowderd's.)
"""

# %% Imports, and the analytics side: run as `xemem_insitu.py analytics NAME`.
import os
import subprocess
import sys

import numpy as np

from clowder import xemem

SHAPE = (512, 512)
STEPS = 4


def analytics(name):
    """For every step number on stdin: attach the snapshot `name`, reduce it, signal."""
    for line in sys.stdin:
        segid = xemem.lookup(name)
        field = xemem.attach(segid, int(np.prod(SHAPE)) * 8, dtype=np.float64).reshape(SHAPE)  # read-only, no copy
        print(f"{line.strip()} {field.mean():.9f} {field.max():.9f}", flush=True)
        del field  # detached here: the last array over the attachment is gone
        xemem.signal(segid)  # the simulation may release the snapshot


if len(sys.argv) == 3 and sys.argv[1] == "analytics":
    analytics(sys.argv[2])
    sys.exit(0)

# %% The simulation's state: a region, zero-filled, that snapshots can be taken of.
field = xemem.zeros(SHAPE)
x, y = np.meshgrid(np.linspace(0, np.pi, SHAPE[1]), np.linspace(0, np.pi, SHAPE[0]))
name = f"insitu-field-{os.getpid()}"

# %% Start the analytics (here a child process; it could as well run in an LWK enclave).
reader = subprocess.Popen([sys.executable, __file__, "analytics", name], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True, bufsize=1)

# %% The time loop: publish a snapshot, let the reader at it, compute on meanwhile.
for step in range(STEPS):
    field[:] = step + np.sin(x * (step + 1)) ** 2 * np.cos(y / 2)  # this step's solution
    expected = (field.mean(), field.max())
    with xemem.snapshot(field, name=name) as snap:
        reader.stdin.write(f"{step}\n")
        field *= 0.5  # the next step's work begins: it goes to copies of the pages it touches
        field[0, 0] = 1e9
        if xemem.wait(snap.segid, timeout=30) == 0:  # the reader signals when done
            raise TimeoutError("the analytics did not signal within 30 s")
        seen_step, mean, peak = reader.stdout.readline().split()
    assert int(seen_step) == step
    assert np.isclose(float(mean), expected[0]) and np.isclose(float(peak), expected[1]), (mean, peak, expected)
    print(f"step {step}: the analytics saw mean {float(mean):+.6f}, max {float(peak):.6f}: "
          f"the snapshot's version, not the writer's later one (max now {field.max():.3g})")

# %% Done: the reader ends at end of input; the region is freed with the last array over it.
reader.stdin.close()
assert reader.wait(timeout=30) == 0
del field
print("in-situ example: every step's analytics read its snapshot unchanged")
