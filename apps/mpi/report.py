#!/usr/bin/env python3
"""docs/results/mpi.md from apps/mpi/bench.sh's raw outputs (one file per case, NAME.why where
the case could not run): ping-pong latency and bandwidth, Allreduce on 2 and 4 ranks, mpicg, and
the issue's three targets.

    report.py RAW_DIR CPU LOAD CG_EDGE
    report.py --cg-only RAW_DIR CPU LOAD CG_EDGE   # the mpicg section and its target row alone
"""
import os
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


def round_names(raw, name):
    """`name` and its later rounds' runs (`name.2`, `name.3`, ...: bench.sh interleaves a
    case's rounds with the other cases')."""
    later = (p.name for p in raw.glob(f"{name}.[0-9]*") if p.name.split(".")[-1].isdigit())
    return [name] + sorted(later, key=lambda n: int(n.split(".")[-1]))


def median(values):
    values = sorted(values)
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def rounds_series(raw, name, pattern):
    """{bytes: the median over the case's rounds} and how many rounds measured anything."""
    runs = [series(read(raw, run), pattern) for run in round_names(raw, name)]
    runs = [run for run in runs if run]
    sizes = {n for run in runs for n in run}
    return {n: median([run[n] for run in runs if n in run]) for n in sizes}, len(runs)


def table(title, raw, prefix, pattern, cases, unit):
    measured, rounds = {}, {}
    for case in cases:
        measured[case], rounds[case] = rounds_series(raw, f"{prefix}.{case}", pattern)
    sizes = sorted({n for values in measured.values() for n in values})
    lines = [f"### {title}", "", "| bytes | " + " | ".join(f"{CASES[c]} {unit}" for c in cases) + " |",
             "|---|" + "---|" * len(cases)]
    for n in sizes:
        cells = [f"{measured[c][n]:.2f}" if n in measured[c] else "-" for c in cases]
        lines.append(f"| {size(n)} | " + " | ".join(cells) + " |")
    missing = [f"- {CASES[c]}: not measured: {why(raw, f'{prefix}.{c}')}" for c in cases if not measured[c]]
    notes = [f"- {CASES[c]}: {note(raw, f'{prefix}.{c}')}" for c in cases if measured[c] and note(raw, f"{prefix}.{c}")]
    several = [CASES[c] for c in cases if rounds[c] > 1]
    if several:
        notes.append(f"- {', '.join(several)}: the median of {max(rounds.values())} runs, interleaved (a round runs each of them once)")
    return lines + [""] + missing + notes + [""], measured


CG_CASES = ["host-shm", "host-ucx", "host-tcp", "enclaves", "enclaves-ucx"]
CG_TARGET = "mpicg on 2 enclaves >= 90% of 2 host processes"


def cg_measure(ours, host):
    return f"{ours:.0f} of {host:.0f} MFLOP/s ({100 * ours / host:.0f}%, medians)"


def cg_met(ours, host):
    return ours >= 0.9 * host


def cg_table(raw, edge):
    """The mpicg table: each case's runs (mpicg.CASE, then mpicg.CASE.2 ... for bench.sh's
    --cg-rounds, which interleaves the cases' runs) and their median; the medians by case."""
    lines = [f"### mpicg, {edge}³ grid on 2 ranks", "",
             "| case | runs | median MFLOP/s | each run's MFLOP/s | each run's warm-up s | verified |",
             "|---|---|---|---|---|---|"]
    medians = {}
    for case in CG_CASES:
        runs = []
        for name in round_names(raw, f"mpicg.{case}"):
            text = read(raw, name)
            m = re.search(r"mpicg: solve [\d.]+ s, ([\d.]+) MFLOP/s", text or "")
            warm = re.search(r"mpicg: warm-up ([\d.]+) s", text or "")
            if m:
                runs.append((float(m.group(1)), warm.group(1) if warm else "-", "solution verified" in text))
        if not runs:
            lines.append(f"| {CASES[case]} | 0 | - | - | - | not measured: {why(raw, f'mpicg.{case}')} |")
            continue
        medians[case] = median(v for v, _, _ in runs)
        each = ", ".join(f"{v:.0f}" for v, _, _ in runs)
        warm_ups = ", ".join(w for _, w, _ in runs)
        verified = "yes" if all(ok for _, _, ok in runs) else "NO"
        lines.append(f"| {CASES[case]} | {len(runs)} | {medians[case]:.1f} | {each} | {warm_ups} | {verified} |")
    return lines, medians


def enclave_pages():
    """The enclaves' page size, as bench.sh says it (`--hugepages`: MPI_BENCH_PAGES=2M)."""
    return "2 MiB pages" if os.environ.get("MPI_BENCH_PAGES") == "2M" else "4 KiB pages"


def cg_only(raw, cpu, load, edge):
    """The mpicg section alone (bench.sh --cg-only puts it into docs/results/mpi.md), with
    its own date, load and the target's row."""
    raw = Path(raw)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines, cg = cg_table(raw, edge)
    lines.insert(1, "")
    lines.insert(2, f"`apps/mpi/bench.sh --cg-only` on {cpu}, {stamp}, load {load} at the end; the cases' runs "
                    f"interleaved (a round runs each case once); enclave memory on {enclave_pages()}.")
    ours, host = cg.get("enclaves-ucx"), cg.get("host-shm")
    row = f"| {CG_TARGET} | {cg_measure(ours, host)} | {'yes' if cg_met(ours, host) else 'NO'} |" if ours and host \
        else f"| {CG_TARGET} | not measured | no |"
    print("\n".join(lines))
    print(row)


def main(raw, cpu, load, edge):
    raw = Path(raw)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lat = r"pingpong: (\d+) bytes\s+([\d.]+) us"
    bw = r"pingpong: (\d+) bytes\s+[\d.]+ us\s+([\d.]+) MB/s"
    red = r"allreduce: (\d+) bytes\s+\d+ ranks\s+([\d.]+) us"
    out = ["# MPI: host ranks and enclave ranks (issue 25)", "",
           f"`apps/mpi/bench.sh` (in `make bench`) on {cpu}, {stamp}, load {load} at the end. Two cores; every case",
           "runs its ranks on the same two cores (`--bind-to core` for host ranks, one core per enclave,",
           f"its memory on {enclave_pages()}).",
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
    lines, cg = cg_table(raw, edge)
    out += lines
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
    target(CG_TARGET, cg.get(encl), cg.get("host-shm"), cg_measure, cg_met)
    print("\n".join(out))


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--cg-only":
        cg_only(*sys.argv[2:])
    elif len(sys.argv) == 5:
        main(*sys.argv[1:])
    else:
        sys.exit("usage: report.py [--cg-only] RAW_DIR CPU LOAD CG_EDGE")
