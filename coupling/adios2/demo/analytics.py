"""In-situ analytics of cg_sim's solution vector, read through ADIOS2's Python API; which
engine carries it (clowder's XEMEM plugin, SST, BP5 files) is the XML configuration's choice.

python3 analytics.py CONFIG
For each published step: the iteration, the solver's residual, the solution's range and mean,
how far it moved since the last step seen, and the time the read took.
"""
import sys
import time

import adios2
import numpy as np


def main(argv):
    if len(argv) != 2:
        print("usage: analytics.py CONFIG", file=sys.stderr)
        return 2
    adios = adios2.Adios(argv[1])
    io = adios.declare_io("SimulationOutput")
    previous = None
    with adios2.Stream(io, "cg.bp", "r") as stream:
        for _ in stream.steps(timeout=60.0):
            t0 = time.perf_counter()
            x = stream.read("x")
            read_ms = (time.perf_counter() - t0) * 1e3
            it = int(stream.read("iteration"))
            res = float(stream.read("residual"))
            moved = float(np.abs(x - previous).max()) if previous is not None else float("nan")
            print(f"analytics: iteration {it:4d}  residual {res:9.3e}  x in [{x.min():.4f}, "
                  f"{x.max():.4f}]  mean {x.mean():.5f}  moved {moved:9.3e}  "
                  f"read {x.nbytes >> 10} KiB in {read_ms:.2f} ms", flush=True)
            previous = x
        print(f"analytics: {stream.read_attribute('solver')}: end of stream")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
