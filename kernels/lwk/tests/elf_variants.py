#!/usr/bin/env python3
"""Writes broken copies of a static executable for kernels/lwk/test.sh, from its ELF64 header
and program header table:

    elf_variants.py EXECUTABLE PREFIX

PREFIX-huge: the first loadable segment claims 2^63 bytes of memory (past user space).
PREFIX-corrupt-00 .. -15: one to four header or program-header fields overwritten with edge
values or random bits (fixed seed, so every run tries the same sixteen).
"""
import random
import struct
import sys

PT_LOAD = 1

source, prefix = sys.argv[1], sys.argv[2]
base = bytes(open(source, "rb").read())
table = struct.unpack_from("<Q", base, 32)[0]
size, count = struct.unpack_from("<HH", base, 54)
entries = [table + i * size for i in range(count)]

huge = bytearray(base)
first_load = next(entry for entry in entries if struct.unpack_from("<I", huge, entry)[0] == PT_LOAD)
struct.pack_into("<Q", huge, first_load + 40, 1 << 63)  # p_memsz
open(f"{prefix}-huge", "wb").write(huge)

random.seed(7)
for n in range(16):
    image = bytearray(base)
    for _ in range(random.randint(1, 4)):
        if random.random() < 0.3:  # entry, table offset, entry size, entry count
            at = random.choice([24, 32, 54, 56])
            width = 8 if at in (24, 32) else 2
        else:  # a program header's type, flags, offset, address, sizes, alignment
            field = random.choice([0, 4, 8, 16, 32, 40, 48])
            at, width = random.choice(entries) + field, 4 if field < 8 else 8
        value = random.choice([0, 1, 0xFFFFFFFF, 0x7FFFFFFFFFFF, 1 << 47, 0x1000, random.getrandbits(64)])
        image[at:at + width] = (value & ((1 << (8 * width)) - 1)).to_bytes(width, "little")
    open(f"{prefix}-corrupt-{n:02d}", "wb").write(image)
