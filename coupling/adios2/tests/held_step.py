"""Snapshot isolation through the engine: a slow reader holds step 0 while the writer writes
step 1 into the same buffer (QueueLimit=1: one region, rewritten in place under step 0's
snapshot). The reader Gets step 0 only once the writer says it has rewritten it, and must see
step 0's values, every one; then it reads the remaining steps.

python3 held_step.py CONFIG STREAM writer|reader MARKER_FILE
  writer: 3 steps of 2 Mi doubles, step s all equal to s; after its Put of step 1 it creates
          MARKER_FILE (its EndStep then waits for the reader: Block)
  reader: prints "held step 0 unchanged", then "step S ok" for each later step
"""
import os
import sys
import time

import adios2
import numpy as np

N = 2 << 20
STEPS = 3


def writer(config, stream_name, marker):
    adios = adios2.Adios(config)
    io = adios.declare_io("SimulationOutput")
    with adios2.Stream(io, stream_name, "w") as stream:
        for s in range(STEPS):
            stream.begin_step()
            stream.write("field", np.full(N, float(s)), [N], [0], [N])
            if s == 1:
                # Put copies at once: step 1's values are in the buffer step 0 was made from.
                open(marker, "w").close()
            stream.end_step()
    return 0


def reader(config, stream_name, marker):
    adios = adios2.Adios(config)
    io = adios.declare_io("SimulationOutput")
    engine = io.open(stream_name, adios2.bindings.Mode.Read)
    seen = 0
    while engine.begin_step() == adios2.bindings.StepStatus.OK:
        step = engine.current_step()
        if step == 0:
            deadline = time.monotonic() + 30
            while not os.path.exists(marker):
                if time.monotonic() > deadline:
                    print("the writer did not write step 1 while step 0 was held", file=sys.stderr)
                    return 1
                time.sleep(0.01)
        var = io.inquire_variable("field")
        data = np.empty(N)
        engine.get(var, data, adios2.bindings.Mode.Sync)
        wrong = np.count_nonzero(data != float(step))
        if wrong:
            print(f"step {step}: {wrong} of {N} values changed (first {data[data != step][0]})")
            return 1
        print("held step 0 unchanged" if step == 0 else f"step {step} ok")
        engine.end_step()
        seen += 1
    engine.close()
    print(f"end of stream after {seen} steps")
    return 0 if seen == STEPS else 1


def main(argv):
    if len(argv) != 5 or argv[3] not in ("writer", "reader"):
        print("usage: held_step.py CONFIG STREAM writer|reader MARKER_FILE", file=sys.stderr)
        return 2
    return (writer if argv[3] == "writer" else reader)(argv[1], argv[2], argv[4])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
