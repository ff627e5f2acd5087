"""python -m clowder.xemem ls [--json] [--socket PATH]: the node's XEMEM segments."""

import argparse
import json
import sys

from ._ls import DaemonError, list_segments


def _size(value):
    if value is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:g} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m clowder.xemem", description="XEMEM segments of this node")
    commands = parser.add_subparsers(dest="command", required=True)
    ls = commands.add_parser("ls", help="the segments clowderd's name server knows")
    ls.add_argument("--json", action="store_true", help="the daemon's JSON list")
    ls.add_argument("--socket", help="clowderd's socket (default: $CLOWDER_SOCKET, else /run/clowder/clowderd.sock)")
    args = parser.parse_args(argv)
    try:
        segments = list_segments(args.socket)
    except DaemonError as e:
        print(f"clowder.xemem: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(segments, indent=2))
        return 0
    print(f"{'SEGID':<20} {'NAME':<24} {'SIZE':>10} {'ENCLAVE':>8} {'PROCESS':>8}")
    for s in segments:
        none = "-"
        print(f"{s.get('segid_hex') or hex(s.get('segid', 0)):<20} {s.get('name') or none:<24} {_size(s.get('size')):>10} "
              f"{s.get('owner_enclave') or none!s:>8} {s.get('owner_process') or none!s:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
