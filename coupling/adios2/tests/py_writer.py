"""An ordinary adios2 Python writer of the stream cxx_reader.cpp reads (the same variables
as cxx_writer.cpp); the engine comes from the XML configuration.

python3 py_writer.py CONFIG STREAM STEPS ROWS COLS [DTYPE]   (of "field"; float64 by default)
"""
import sys

import adios2
import numpy as np


def main(argv):
    if len(argv) not in (6, 7):
        print("usage: py_writer.py CONFIG STREAM STEPS ROWS COLS [DTYPE]", file=sys.stderr)
        return 2
    steps, rows, cols = (int(a) for a in argv[3:6])
    dtype = argv[6] if len(argv) == 7 else "float64"
    adios = adios2.Adios(argv[1])
    io = adios.declare_io("SimulationOutput")
    half = rows // 2
    with adios2.Stream(io, argv[2], "w") as stream:
        for s in range(steps):
            stream.begin_step()
            data = s * 1e6 + np.arange(rows * cols, dtype=dtype).reshape(rows, cols)
            # The global array as two blocks, as two ranks of a simulation would write it.
            stream.write("field", data[:half].copy(), [rows, cols], [0, 0], [half, cols])
            stream.write("field", data[half:].copy(), [rows, cols], [half, 0], [rows - half, cols])
            stream.write("step", np.array(s, dtype=np.int32))  # a 0-d array: an int32 value
            stream.write("label", f"step-{s}")
            stream.write("local", np.array([s, s + 1, s + 2], dtype=np.int64), [], [], [3])
            stream.write_attribute("units", "kelvin")
            stream.end_step()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
