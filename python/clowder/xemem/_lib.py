"""libxpmem through ctypes: the library, its prototypes and its errors as exceptions.

ctypes rather than cffi or a compiled extension: the API is a dozen C functions of plain
integers and pointers, and ctypes is in the standard library, so `pip install` needs no
compiler. The library is loaded on first use, so that what needs no memory sharing (the
segment listing of __main__) works without it.
"""

import ctypes
import errno
import functools
import os

PAGE = 4096
XPMEM_RDWR = 0x2
XPMEM_PERMIT_MODE = 0x1
XEMEM_NAME_MAX = 63
_FAILED_ADDRESS = ctypes.c_void_p(-1).value


class XememError(OSError):
    """A libxpmem call failed: `errno` is XPMEM's errno, `strerror` says which call on what and
    why, with libxpmem's own reason (xemem_errmsg) when it has one."""


class NotFoundError(XememError):
    """ENOENT: no such segment, permit or name (or no longer: removed, or its owner exited)."""


class AccessError(XememError):
    """EACCES: the segment's mode does not grant this process the access."""


class BusyError(XememError):
    """EBUSY: a snapshot of the region is out, or the region is exported."""


for _exception in (XememError, NotFoundError, AccessError, BusyError):
    _exception.__module__ = "clowder.xemem"  # where users import them from

_BY_ERRNO = {errno.ENOENT: NotFoundError, errno.EACCES: AccessError, errno.EBUSY: BusyError}


class _Addr(ctypes.Structure):
    _fields_ = [("apid", ctypes.c_int64), ("offset", ctypes.c_int64)]


_PROTOTYPES = {
    "xpmem_make": (ctypes.c_int64, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]),
    "xpmem_remove": (ctypes.c_int, [ctypes.c_int64]),
    "xpmem_get": (ctypes.c_int64, [ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]),
    "xpmem_release": (ctypes.c_int, [ctypes.c_int64]),
    "xpmem_attach": (ctypes.c_void_p, [_Addr, ctypes.c_size_t, ctypes.c_void_p]),
    "xpmem_detach": (ctypes.c_int, [ctypes.c_void_p]),
    "xemem_make": (ctypes.c_int64, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]),
    "xemem_lookup_segid": (ctypes.c_int64, [ctypes.c_char_p]),
    "xemem_signal": (ctypes.c_int, [ctypes.c_int64]),
    "xemem_notify_fd": (ctypes.c_int, [ctypes.c_int64]),
    "xemem_errmsg": (ctypes.c_char_p, []),
    "xemem_region_alloc": (ctypes.c_void_p, [ctypes.c_size_t]),
    "xemem_region_free": (ctypes.c_int, [ctypes.c_void_p]),
    "xemem_snapshot_make": (ctypes.c_int64, [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p]),
    "xemem_snapshot_release": (ctypes.c_int, [ctypes.c_int64]),
}


@functools.lru_cache(maxsize=None)
def lib():
    """The loaded libxpmem, with its prototypes set; XememError when it cannot be loaded."""
    path = os.environ.get("CLOWDER_LIBXPMEM") or "libxpmem.so.0"
    try:
        library = ctypes.CDLL(path, use_errno=True)
    except OSError as e:
        raise XememError(errno.ENOENT, f"cannot load libxpmem ({path}): {e}; set CLOWDER_LIBXPMEM to "
                         "clowder's libxpmem.so.0 (xemem/build/lib after make, or where make install put it)") from None
    for name, (restype, argtypes) in _PROTOTYPES.items():
        try:
            function = getattr(library, name)
        except AttributeError:
            raise XememError(errno.ENOSYS, f"{path} has no {name}: it is not clowder's libxpmem, or an older one") from None
        function.restype = restype
        function.argtypes = argtypes
    return library


def error(what):
    """The exception for the libxpmem call that just failed (errno, and xemem_errmsg's reason)."""
    code = ctypes.get_errno()
    reason = lib().xemem_errmsg()
    text = f"{what}: {os.strerror(code)}"
    if reason:
        text += f" ({reason.decode(errors='replace')})"
    return _BY_ERRNO.get(code, XememError)(code, text)


def check(result, what):
    """`result` of a call returning -1 on failure, or the exception."""
    if result == -1:
        raise error(what)
    return result


def name_bytes(name):
    """A segment name as the library takes it; ValueError naming the rule it breaks."""
    if not isinstance(name, str):
        raise TypeError(f"a segment name is a str, not {type(name).__name__}")
    if not 1 <= len(name) <= XEMEM_NAME_MAX or not name.isprintable() or not name.isascii() or " " in name:
        raise ValueError(f"segment name {name!r}: 1 to {XEMEM_NAME_MAX} printable ASCII characters without spaces")
    return name.encode()
