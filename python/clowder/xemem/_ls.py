"""The segments clowderd's XEMEM name server knows, from the daemon's API (`xemem_ls`).

Names and segments live in the name server, which clowderd runs; libxpmem has no listing
call, so this asks the daemon over its socket: one JSON request line, one reply line
(docs/api-schema.md), as the `clowder xemem ls` command does.
"""

import json
import os
import socket

DEFAULT_SOCKET = "/run/clowder/clowderd.sock"
MAX_REPLY = 64 << 20  # the API's longest reply line


class DaemonError(RuntimeError):
    """clowderd could not be reached or refused the request; the message says which."""


DaemonError.__module__ = "clowder.xemem"


def list_segments(socket_path=None, timeout=10.0):
    """The segments the node's name server knows: dicts with segid, segid_hex, owner_enclave,
    owner_process, size and name (None where unknown). The daemon's socket is `socket_path`,
    else $CLOWDER_SOCKET, else /run/clowder/clowderd.sock."""
    path = socket_path or os.environ.get("CLOWDER_SOCKET") or DEFAULT_SOCKET
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(timeout)
            connection.connect(path)
            connection.sendall(b'{"op": "xemem_ls"}\n')
            line = bytearray()
            while not line.endswith(b"\n"):
                chunk = connection.recv(1 << 16)
                if not chunk:
                    raise DaemonError(f"clowderd at {path} closed the connection before answering")
                line += chunk
                if len(line) > MAX_REPLY:
                    raise DaemonError(f"clowderd at {path} answered with more than {MAX_REPLY} bytes")
    except OSError as e:
        raise DaemonError(f"cannot reach clowderd at {path}: {e.strerror or e}") from None
    try:
        reply = json.loads(line)
    except ValueError as e:
        raise DaemonError(f"clowderd at {path} answered with something that is not JSON: {e}") from None
    if not isinstance(reply, dict) or reply.get("ok") is not True:
        message = reply.get("error", "no reason given") if isinstance(reply, dict) else "not an object"
        raise DaemonError(f"clowderd refused xemem_ls: {message}")
    segments = reply.get("segments")
    if not isinstance(segments, list) or not all(isinstance(s, dict) for s in segments):
        raise DaemonError("clowderd's xemem_ls reply has no list of segments")
    return segments
