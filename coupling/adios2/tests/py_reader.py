"""An ordinary adios2 Python reader of cxx_writer's (or py_writer.py's) stream; the engine
comes from the XML configuration. Checks every value and prints one line per step.

python3 py_reader.py CONFIG STREAM [R0 C0 NR NC]   (a selection of "field"; whole without)
Exit 0 when every step checks out, 1 on a wrong value or an error (printed).
"""
import sys

import adios2
import numpy as np


def main(argv):
    if len(argv) not in (3, 7):
        print("usage: py_reader.py CONFIG STREAM [R0 C0 NR NC]", file=sys.stderr)
        return 2
    adios = adios2.Adios(argv[1])
    io = adios.declare_io("SimulationOutput")
    steps = 0
    with adios2.Stream(io, argv[2], "r") as stream:
        for _ in stream.steps(timeout=10.0):
            s = stream.current_step()
            shape = stream.inquire_variable("field").shape()
            if len(argv) == 7:
                start = [int(argv[3]), int(argv[4])]
                count = [int(argv[5]), int(argv[6])]
                field = stream.read("field", start, count)
            else:
                start, count = [0, 0], shape
                field = stream.read("field")
            step = int(stream.read("step"))
            label = stream.read("label")
            units = stream.read_attribute("units")
            rows = np.arange(start[0], start[0] + count[0])[:, None]
            cols = np.arange(start[1], start[1] + count[1])[None, :]
            want = s * 1e6 + rows * shape[1] + cols
            ok = (field.dtype == np.float64 and field.shape == tuple(count)
                  and np.array_equal(field, want) and step == s
                  and label == f"step-{s}" and list(np.atleast_1d(units)) == ["kelvin"])
            print(f"step {s} {'ok' if ok else 'WRONG'} shape {shape[0]}x{shape[1]} "
                  f"sel {start[0]}+{count[0]},{start[1]}+{count[1]} sum {field.sum():.17g} "
                  f"label {label}", flush=True)
            if not ok:
                return 1
            steps += 1
    print(f"end of stream after {steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
