"""clowder: the Python side of the clowder HPC node runtime.

`clowder.xemem` shares memory between processes and enclaves as numpy arrays (XEMEM, the
XPMEM API across enclaves), including copy-on-write snapshots.
"""

__version__ = "0.1.0"
