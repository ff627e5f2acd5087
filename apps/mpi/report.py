#!/usr/bin/env python3
"""docs/results/mpi.md from apps/mpi/bench.sh's raw outputs (one file per case, NAME.why where
the case could not run): ping-pong latency and bandwidth, Allreduce on 2 and 4 ranks, mpicg, and
the issue's three targets.

    report.py RAW_DIR CPU LOAD CG_EDGE
"""
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

CASES = {
    "host-shm": "host (shm)",
    "host-ucx": "host (UCX/xpmem)",
    "host-tcp": "host (tcp)",
    "host-2nodes": "host, 2 nodes",
    "enclaves": "enclaves a, b",
    "enclaves-ucx": "enclaves a, b (UCX/xpmem)",
    "enclave": "enclave a",
    "enclaves-2nodes": "enclaves, 2 nodes",
}


def read(raw, name):
    path = raw / name
    return path.read_text(errors="replace") if path.exists() and not (raw / f"{name}.why").exists() else None


def note(raw, name):
    path = raw / f"{name}.note"
    return "; ".join(path.read_text().split("\n")).strip("; ") if path.exists() else None


def why(raw, name):
    path = raw / f"{name}.why"
    return path.read_text().strip() if path.exists() else "not run"


def series(text, pattern):
    """{bytes: value} from the lines of `text` matching `pattern` (groups: bytes, value)."""
    return {int(m.group(1)): float(m.group(2)) for m in re.finditer(pattern, text or "")}


def size(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} B"


def table(title, raw, prefix, pattern, cases, unit):
    measured = {case: series(read(raw, f"{prefix}.{case}"), pattern) for case in cases}
    sizes = sorted({n for values in measured.values() for n in values})
    lines = [f"### {title}", "", "| bytes | " + " | ".join(f"{CASES[c]} {unit}" for c in cases) + " |",
             "|---|" + "---|" * len(cases)]
    for n in sizes:
        cells = [f"{measured[c][n]:.2f}" if n in measured[c] else "-" for c in cases]
        lines.append(f"| {size(n)} | " + " | ".join(cells) + " |")
    missing = [f"- {CASES[c]}: not measured: {why(raw, f'{prefix}.{c}')}" for c in cases if not measured[c]]
    notes = [f"- {CASES[c]}: {note(raw, f'{prefix}.{c}')}" for c in cases if measured[c] and note(raw, f"{prefix}.{c}")]
    return lines + [""] + missing + notes + [""], measured


def main(raw, cpu, load, edge):
    raw = Path(raw)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lat = r"pingpong: (\d+) bytes\s+([\d.]+) us"
    bw = r"pingpong: (\d+) bytes\s+[\d.]+ us\s+([\d.]+) MB/s"
    red = r"allreduce: (\d+) bytes\s+\d+ ranks\s+([\d.]+) us"
    out = ["# MPI: host ranks and enclave ranks (issue 25)", "",
           f"`apps/mpi/bench.sh` (in `make bench`) on {cpu}, {stamp}, load {load} at the end. Two cores; every case",
           "runs its ranks on the same two cores (`--bind-to core` for host ranks, one core per enclave,",
           "its memory on 4 KiB pages: XEMEM attaches of a hugepage enclave's memory are whole 2 MiB pages).",
           "Nodes are network namespaces on a bridge (scripts/nodes.sh), each with its own clowderd;",
           "enclave ranks and the `tcp` rows use Open MPI's TCP transport (`--mca btl tcp,self`), but for",
           "the `UCX/xpmem` rows: Open MPI's UCX PML over UCX's xpmem transport on libxpmem (docs/mpi.md).", ""]
    lines, lat_by = table("Ping-pong latency (half round trip)", raw, "pingpong", lat, list(CASES), "us")
    out += lines
    lines, bw_by = table("Ping-pong bandwidth", raw, "pingpong", bw, list(CASES), "MB/s")
    out += lines
    lines, _ = table("Allreduce, 2 ranks (time per call)", raw, "allreduce", red, list(CASES), "us")
    out += lines
    lines, _ = table("Allreduce, 4 ranks (time per call)", raw, "allreduce4", red,
                     ["host-shm", "host-tcp", "host-2nodes", "enclaves"], "us")
    out += lines
    out += [f"### mpicg, {edge}³ grid on 2 ranks", "", "| case | solve s | MFLOP/s | verified |", "|---|---|---|---|"]
    cg = {}
    for case in ["host-shm", "host-tcp", "enclaves", "enclaves-ucx"]:
        text = read(raw, f"mpicg.{case}")
        m = re.search(r"mpicg: solve ([\d.]+) s, ([\d.]+) MFLOP/s", text or "")
        if m:
            cg[case] = float(m.group(2))
            out.append(f"| {CASES[case]} | {m.group(1)} | {m.group(2)} | {'yes' if 'solution verified' in text else 'NO'} |")
        else:
            out.append(f"| {CASES[case]} | - | - | not measured: {why(raw, f'mpicg.{case}')} |")
    out += ["", "### Targets", "", "| target | measured | met |", "|---|---|---|"]

    def target(name, ours, host, fmt, ok):
        if ours is None or host is None:
            out.append(f"| {name} | not measured (enclave ranks: {why(raw, 'pingpong.enclaves')}) | no |")
        else:
            out.append(f"| {name} | {fmt(ours, host)} | {'yes' if ok(ours, host) else 'NO'} |")

    # The enclaves' best path: UCX over XEMEM where it was measured, else TCP.
    encl = "enclaves-ucx" if lat_by["enclaves-ucx"] else "enclaves"
    out.append(f"| path between the enclaves | {CASES[encl]} | |")
    host_lat, encl_lat = lat_by["host-shm"].get(8), lat_by[encl].get(8)
    target("8 B latency between 2 enclaves <= 2x two host processes", encl_lat, host_lat,
           lambda o, h: f"{o:.2f} us vs {h:.2f} us ({o / h:.1f}x)", lambda o, h: o <= 2 * h)
    big = [n for n in bw_by["host-shm"] if n >= 1 << 20 and n in bw_by[encl]]
    worst = min(big, key=lambda n: bw_by[encl][n] / bw_by["host-shm"][n]) if big else None
    target("bandwidth >= 1 MiB between 2 enclaves >= 80% of the host's",
           bw_by[encl].get(worst), bw_by["host-shm"].get(worst),
           lambda o, h: f"worst at {size(worst)}: {o:.0f} of {h:.0f} MB/s ({100 * o / h:.0f}%)", lambda o, h: o >= 0.8 * h)
    target("mpicg on 2 enclaves >= 90% of 2 host processes", cg.get(encl), cg.get("host-shm"),
           lambda o, h: f"{o:.0f} of {h:.0f} MFLOP/s ({100 * o / h:.0f}%)", lambda o, h: o >= 0.9 * h)
    print("\n".join(out))


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit("usage: report.py RAW_DIR CPU LOAD CG_EDGE")
    main(*sys.argv[1:])
