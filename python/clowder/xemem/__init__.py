"""XEMEM from Python: segments and snapshots as numpy arrays, with no copy.

    import numpy as np
    from clowder import xemem

    data = xemem.zeros((1024, 1024))         # shareable memory (a region), zero-filled
    segid = xemem.make(data, name="field")   # exported; any process or enclave can attach it
    view = xemem.attach(xemem.lookup("field"), data.nbytes, dtype=data.dtype)  # elsewhere
    with xemem.snapshot(data) as snap:       # copy-on-write: readers of snap.segid see this
        data += 1                            # version while the writer goes on

Every array returned here is a view of the shared memory itself: a store by its owner is seen
by every attacher at once. Attachments are detached, regions freed and snapshots released
when the last array over them is garbage (a finalizer on the object that owns the memory, so
views and slices keep it alive). Errors of libxpmem raise XememError (or its subclasses
NotFoundError, AccessError, BusyError) with libxpmem's errno and text; bad arguments raise
ValueError or TypeError before anything is called. The library is clowder's libxpmem.so.0:
$CLOWDER_LIBXPMEM, else the loader's path.
"""

import ctypes
import os
import select
import weakref

import numpy as np

from ._lib import PAGE, XPMEM_PERMIT_MODE, XPMEM_RDWR, AccessError, BusyError, NotFoundError, XememError
from ._lib import _FAILED_ADDRESS, _Addr, check, error, lib, name_bytes
from ._ls import DaemonError, list_segments

__all__ = [
    "attach", "make", "remove", "lookup", "signal", "notify_fd", "wait", "zeros", "snapshot", "Snapshot",
    "list_segments", "DaemonError", "XememError", "NotFoundError", "AccessError", "BusyError", "PAGE",
]

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_PROT_READ, _PROT_WRITE = 0x1, 0x2

# Buffers exported by make, by segid: kept alive (and in place) until remove.
_made = {}


class _Owner:
    """Marks the ctypes object that owns shared memory: the end of every array's base chain."""


class _Attachment(_Owner):
    pass


class _Region(_Owner):
    pass


def _owner(address, length, kind):
    """A ctypes byte array of `length` at `address`, of a subclass of `kind` (an _Owner)."""
    return type(kind.__name__, (ctypes.c_ubyte * length, kind), {}).from_address(address)


def _round_up(n):
    return (n + PAGE - 1) // PAGE * PAGE


def _positive_int(value, what):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} is an int, not {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{what} must be positive, not {value}")
    return int(value)


def _detach(address, length, apid, writable):
    # Made writable again first: libxpmem may keep a detached mapping for a later attach.
    if not writable:
        _libc.mprotect(address, length, _PROT_READ | _PROT_WRITE)
    lib().xpmem_detach(address)
    lib().xpmem_release(apid)


def attach(segid, nbytes, dtype=np.uint8, offset=0, writable=False):
    """A 1-D numpy array of `dtype` over `nbytes` bytes of segment `segid` from byte `offset`,
    mapped with no copy. Read-only unless `writable` (the memory itself is then protected, not
    only the array). Detached when the last array over it is released.

    ValueError: nbytes not a multiple of the dtype's size, negative offset, an object dtype;
    XememError: the segment does not exist (NotFoundError), its mode refuses us (AccessError),
    or the range is not inside it (errno EINVAL).
    """
    segid = _positive_int(segid, "segid")
    nbytes = _positive_int(nbytes, "nbytes")
    dtype = np.dtype(dtype)
    if dtype.hasobject or dtype.itemsize == 0:
        raise ValueError(f"dtype {dtype} cannot live in shared memory (Python objects or no size)")
    if nbytes % dtype.itemsize:
        raise ValueError(f"nbytes {nbytes} is not a whole number of {dtype} items ({dtype.itemsize} bytes each)")
    if isinstance(offset, (bool, np.bool_)) or not isinstance(offset, (int, np.integer)):
        raise TypeError(f"offset is an int, not {type(offset).__name__}")
    if offset < 0:
        raise ValueError(f"offset must be 0 or more, not {offset}")
    # XPMEM attaches whole pages: the page holding `offset` up to the one holding the end.
    lead = offset % PAGE
    length = _round_up(lead + nbytes)
    apid = check(lib().xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, None), f"get segment {segid:#x}")
    address = lib().xpmem_attach(_Addr(apid, offset - lead), length, None)
    if address == _FAILED_ADDRESS or address is None:
        failure = error(f"attach {nbytes} bytes at offset {offset} of segment {segid:#x}")
        lib().xpmem_release(apid)
        raise failure
    if not writable and _libc.mprotect(address, length, _PROT_READ) != 0:
        code = ctypes.get_errno()
        _detach(address, length, apid, True)
        raise XememError(code, f"make the attachment of segment {segid:#x} read-only: {os.strerror(code)}")
    memory = _owner(address, length, _Attachment)
    weakref.finalize(memory, _detach, address, length, apid, writable)
    view = memoryview(memory)
    if not writable:
        view = view.toreadonly()
    return np.frombuffer(view, dtype=dtype, count=nbytes // dtype.itemsize, offset=lead)


def _address_of(buffer):
    """The address and size of a writable, C-contiguous buffer, with the object that keeps it."""
    try:
        view = memoryview(buffer)
    except TypeError:
        raise TypeError(f"make takes a buffer (a numpy array, bytearray, mmap ...), not {type(buffer).__name__}") from None
    if view.readonly:
        raise ValueError("make needs writable memory: read-only memory would read as holes to attachers (SIGBUS)")
    if not view.c_contiguous:
        raise ValueError("make needs C-contiguous memory (np.ascontiguousarray makes a copy that is)")
    if view.nbytes == 0:
        raise ValueError("make needs at least one byte")
    raw = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    keeper = (ctypes.c_char * raw.nbytes).from_buffer(raw)
    return ctypes.addressof(keeper), raw.nbytes, keeper


def make(buffer, name=None, mode=0o600):
    """Exports `buffer` (a numpy array or any writable C-contiguous buffer starting on a page
    boundary, as from zeros()) as a segment; returns its segid. With `name` (1..63 printable
    ASCII characters, no spaces) the segment is found machine-wide by lookup(name), with mode
    0o666 (XEMEM's); without, `mode` (SysV-style, as xpmem_make's) guards it. Whole pages are
    exported: the rest of the buffer's last page too. The buffer is kept alive until remove.
    """
    address, nbytes, keeper = _address_of(buffer)
    if address % PAGE:
        raise ValueError(f"the buffer starts at {address:#x}, not on a page boundary ({PAGE} bytes): "
                         "allocate it with clowder.xemem.zeros")
    if not isinstance(mode, int) or not 0 <= mode <= 0o777:
        raise ValueError(f"mode is a permission from 0 to 0o777, not {mode!r}")
    size = _round_up(nbytes)
    if name is None:
        segid = check(lib().xpmem_make(address, size, XPMEM_PERMIT_MODE, mode), f"make a segment of {nbytes} bytes")
    else:
        segid = check(lib().xemem_make(address, size, name_bytes(name)), f"make the segment {name!r}")
    _made[segid] = keeper
    return segid


def remove(segid):
    """Withdraws this process's segment `segid`: new attaches fail, existing attachments of
    converted memory see SIGBUS (as XPMEM's), and the buffer is no longer kept alive."""
    segid = _positive_int(segid, "segid")
    if lib().xpmem_remove(segid) == -1:
        failure = error(f"remove segment {segid:#x}")
        if isinstance(failure, NotFoundError):
            _made.pop(segid, None)  # gone already (its owner's connection, a name server restart)
        raise failure
    _made.pop(segid, None)


def lookup(name):
    """The segid of the segment (or snapshot) made under `name`; NotFoundError if there is none (yet)."""
    return check(lib().xemem_lookup_segid(name_bytes(name)), f"look up {name!r}")


def signal(segid):
    """Wakes the owner of segment `segid` (its notify_fd becomes readable)."""
    segid = _positive_int(segid, "segid")
    apid = check(lib().xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, None), f"get segment {segid:#x}")
    try:
        check(lib().xemem_signal(apid), f"signal segment {segid:#x}")
    finally:
        lib().xpmem_release(apid)


def notify_fd(segid):
    """The owner's descriptor for signals to its segment `segid` (non-blocking; readable when
    signalled; read gives an 8-byte count). Owned by libxpmem: do not close it."""
    segid = _positive_int(segid, "segid")
    return check(lib().xemem_notify_fd(segid), f"notify descriptor of segment {segid:#x}")


def wait(segid, timeout=None):
    """Waits up to `timeout` seconds (None: for ever) for signals to this process's segment
    `segid`; returns how many arrived since the last wait (0 when the time ran out)."""
    fd = notify_fd(segid)
    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
        return 0
    try:
        return int.from_bytes(os.read(fd, 8), "little")
    except BlockingIOError:
        return 0


def _free_region(address):
    lib().xemem_region_free(address)


def zeros(shape, dtype=np.float64):
    """A zero-filled numpy array in a new region: shared memory that starts on a page, can be
    exported by make() and snapshotted by snapshot(). Freed when the last array over it goes."""
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise ValueError(f"dtype {dtype} cannot live in shared memory (Python objects)")
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    count = int(np.prod(shape, dtype=np.int64))
    if count <= 0 or dtype.itemsize == 0:
        raise ValueError(f"zeros needs at least one byte, not shape {shape} of {dtype}")
    nbytes = count * dtype.itemsize
    address = lib().xemem_region_alloc(nbytes)
    if address == _FAILED_ADDRESS or address is None:
        raise error(f"allocate a region of {nbytes} bytes")
    memory = _owner(address, _round_up(nbytes), _Region)
    weakref.finalize(memory, _free_region, address)
    return np.frombuffer(memory, dtype=dtype, count=count).reshape(shape)


def _region_of(array):
    """The Region that owns `array`'s memory (following its base chain), or ValueError."""
    owner = array
    while owner is not None and not isinstance(owner, _Owner):
        owner = owner.obj if isinstance(owner, memoryview) else getattr(owner, "base", None)
    if not isinstance(owner, _Region):
        raise ValueError("snapshot takes an array over a region: allocate it with clowder.xemem.zeros")
    return owner


def _release_quietly(segid, region):
    # At garbage collection or exit there is nobody to raise to; the region goes next.
    del region
    lib().xemem_snapshot_release(segid)


class Snapshot:
    """A copy-on-write snapshot of a region: readers attach `segid` (or lookup(name)) and see
    the region as it was when the snapshot was taken, while the writer goes on writing. Release
    it (release(), the end of a `with` block, or garbage collection) once readers are done: a
    reader still attached sees the writer's newer data from the region's next snapshot on."""

    def __init__(self, region, segid, name):
        self.segid = segid
        self.name = name
        self._finalizer = weakref.finalize(self, _release_quietly, segid, region)

    @property
    def released(self):
        return not self._finalizer.alive

    def release(self):
        """Withdraws the snapshot (new attaches fail); idempotent."""
        if self._finalizer.alive:
            check(lib().xemem_snapshot_release(self.segid), f"release snapshot {self.segid:#x}")
            self._finalizer.detach()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        state = "released" if self.released else "out"
        return f"Snapshot(segid={self.segid:#x}, name={self.name!r}, {state})"


def snapshot(array, name=None, mode=0o600):
    """Publishes what the region under `array` (from zeros(), any view of it) holds now as a
    read-only snapshot segment; returns a Snapshot. Costs the pages written between snapshots
    (a fault on each page's first store, a copy into the region's memory at the next snapshot)
    and a walk of the region's page table, not a copy of the region. One snapshot per region at
    a time (BusyError).
    `name` and `mode` as make's; readers need read and write in `mode`, as XPMEM attaches."""
    region = _region_of(array)
    if not isinstance(mode, int) or not 0 <= mode <= 0o777:
        raise ValueError(f"mode is a permission from 0 to 0o777, not {mode!r}")
    encoded = None if name is None else name_bytes(name)
    segid = lib().xemem_snapshot_make(ctypes.addressof(region), XPMEM_PERMIT_MODE, mode, encoded)
    if segid == -1:
        failure = error("take a snapshot" + ("" if name is None else f" named {name!r}"))
        if isinstance(failure, BusyError):
            failure = BusyError(failure.errno, f"{failure.strerror}: a snapshot of this region is out, "
                                "or the region is exported by make")
        raise failure
    return Snapshot(region, segid, name)
