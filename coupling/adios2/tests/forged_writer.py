"""A hostile writer: publishes a stream whose segments are wrong in one way, with libxpmem
through ctypes and no ADIOS2, to check that a reader reports it and does not crash.

python3 forged_writer.py LIBXPMEM STREAM CASE SECONDS
CASE: control (counts larger than the control segment), count (a block's count disagrees with
its size), offset (a block's data lies past the segment's end), record (a record longer than
the metadata), type (an unknown type name). The segments stay up SECONDS seconds.
"""
import ctypes
import mmap
import struct
import sys
import time

PAGE = 4096


def var_record(name, type_name, shape, start, count, data_offset, data_size):
    nd = len(shape)
    body = struct.pack(f"<{3 * nd}Q", *shape, *start, *count) + type_name + name
    size = (32 + len(body) + 7) // 8 * 8
    head = struct.pack("<IBBBBIIQQ", size, 0, nd, len(type_name), 0, len(name), 0, data_offset, data_size)
    return (head + body).ljust(size, b"\0")


def main(argv):
    lib = ctypes.CDLL(argv[1])
    lib.xemem_make.restype = lib.xpmem_make.restype = ctypes.c_int64
    lib.xemem_make.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    lib.xpmem_make.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    stream, case, seconds = argv[2], argv[3], float(argv[4])

    step = mmap.mmap(-1, 2 * PAGE)  # shared anonymous memory: libxpmem hands it out as it is
    meta = var_record(b"field", b"double", [4, 4], [0, 0], [4, 4], PAGE, 128)
    if case == "count":
        meta = var_record(b"field", b"double", [4, 4], [0, 0], [1 << 40, 1 << 40], PAGE, 128)
    elif case == "offset":
        meta = var_record(b"field", b"double", [4, 4], [0, 0], [4, 4], 1 << 30, 128)
    elif case == "type":
        meta = var_record(b"field", b"quaternion", [4, 4], [0, 0], [4, 4], PAGE, 128)
    elif case == "record":
        meta = struct.pack("<I", 1 << 20) + meta[4:]
    meta_at = PAGE + 128
    step[0:56] = struct.pack("<8sIIIIQQQQ", b"CLWDASTP", 1, 1, 0, 0, 0, meta_at + len(meta), meta_at, len(meta))
    step[meta_at:meta_at + len(meta)] = meta
    step_addr = ctypes.addressof(ctypes.c_char.from_buffer(step))
    segid = lib.xpmem_make(step_addr, 2 * PAGE, 1, ctypes.c_void_p(0o666))

    control = mmap.mmap(-1, PAGE)
    slots = 100000 if case == "control" else 1
    control[0:56] = struct.pack("<8sIIIIQQQQ", b"CLWDACTL", 1, slots, 1, 0, 1, 0, 1, 0)
    control[128:160] = struct.pack("<QQqQ", 2, 0, segid, 2 * PAGE)  # publication 0 is valid
    control_addr = ctypes.addressof(ctypes.c_char.from_buffer(control))
    if segid <= 0 or lib.xemem_make(control_addr, PAGE, f"adios2:{stream}".encode()) <= 0:
        print("forged_writer: could not make the segments", file=sys.stderr)
        return 1
    time.sleep(seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
