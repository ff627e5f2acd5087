"""Reading in place from Python: adios2's own Python API for the steps, and the engine's
clowder_adios2_block_data (include/clowder_adios2_read.h; adios2's bindings have no zero-copy
call) through ctypes on the PluginLibrary path, the copy of the library ADIOS2 loaded. Each
block of cxx_writer's "field" (as adios2's blocks_info lists them) becomes a read-only numpy array over the writer's memory, and
every value is checked against cxx_writer's formula; the call after end_step is refused.

python3 py_zc_reader.py CONFIG STREAM PLUGIN_LIBRARY
Prints "step S ok blocks N" per step, "after end_step: MESSAGE" once, and
"end of stream after N steps".
"""
import ctypes
import sys

import adios2
import numpy as np

MAX_DIMS = 32
IO_NAME = b"SimulationOutput"


class Block(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("nbytes", ctypes.c_size_t),
        ("nblocks", ctypes.c_size_t),
        ("step", ctypes.c_uint64),
        ("ndims", ctypes.c_size_t),
        ("shape", ctypes.c_uint64 * MAX_DIMS),
        ("start", ctypes.c_uint64 * MAX_DIMS),
        ("count", ctypes.c_uint64 * MAX_DIMS),
    ]


def block_array(lib, name, k):
    """Block k of `name` as (a read-only float64 array over the writer's memory, the Block)."""
    b = Block()
    if lib.clowder_adios2_block_data(IO_NAME, name, b"double", k, ctypes.byref(b)) != 0:
        raise RuntimeError(lib.clowder_adios2_read_error().decode())
    count = tuple(b.count[: b.ndims])
    raw = (ctypes.c_char * b.nbytes).from_address(b.data)
    array = np.frombuffer(raw, dtype=np.float64).reshape(count)
    array.flags.writeable = False  # the writer's memory
    return array, b


def main(argv):
    if len(argv) != 4:
        print("usage: py_zc_reader.py CONFIG STREAM PLUGIN_LIBRARY", file=sys.stderr)
        return 2
    lib = ctypes.CDLL(argv[3])
    lib.clowder_adios2_block_data.argtypes = [
        ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(Block)]
    lib.clowder_adios2_read_error.restype = ctypes.c_char_p
    adios = adios2.Adios(argv[1])
    io = adios.declare_io(IO_NAME.decode())
    engine = io.open(argv[2], adios2.bindings.Mode.Read)
    steps = 0
    while engine.begin_step() == adios2.bindings.StepStatus.OK:
        # The blocks as adios2 lists them (the engine answers its BlocksInfo query).
        infos = engine.blocks_info("field", engine.current_step())
        wrong = int(len(infos) != 2)  # cxx_writer writes two blocks
        for info in infos:
            array, b = block_array(lib, b"field", int(info["BlockID"]))
            wrong += info["Start"] != f"{b.start[0]},{b.start[1]}" or b.nblocks != len(infos)
            rows = np.arange(b.start[0], b.start[0] + b.count[0])[:, None]
            cols = np.arange(b.start[1], b.start[1] + b.count[1])[None, :]
            wrong += np.count_nonzero(array != b.step * 1e6 + rows * b.shape[1] + cols)
        engine.end_step()
        print(f"step {b.step} {'WRONG' if wrong else 'ok'} blocks {b.nblocks}", flush=True)
        if wrong:
            return 1
        if steps == 0:
            try:
                block_array(lib, b"field", 0)
                print("after end_step: NOT REFUSED")
                return 1
            except RuntimeError as e:
                print(f"after end_step: {e}")
        steps += 1
    engine.close()
    print(f"end of stream after {steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
