#!/usr/bin/env python3
"""Draws the benchmark results the tables under docs/results/ hold as PNG figures beside them.

    bench/plot.py            # all figures whose results file exists
    bench/plot.py xemem dex  # some

xemem-attach.png: attach + read against the single-core read of the same run, by region
size, for every path with 2 MiB backing (the issue's 90% line; the paper's Fig. 5 plots
GB/s, about 12 for attach + read), and attach throughput (the paper's 12.8 GB/s at 1 GiB).
dex-scaling.png: speed-up from 1 to 2 nodes per application, naive and optimised, as the
paper's Fig. 2, with the issue's 1.8x line. dex-latency.png: migration and remote fault
latencies per configuration beside DEX's Table II and the issue's targets. lwk-detours.png:
every selfish detour of the median host and enclave runs over time (lwk-detours.tsv).
adios2.png: per-step writer and reader times by step size for the clowder ADIOS2 engine, SST,
BP5 and raw XEMEM (adios2.md). mpi.png: MPI ping-pong latency and bandwidth by message size for
host and enclave ranks (mpi.md).

Needs matplotlib (pip install matplotlib); reads only the markdown the benchmarks wrote.
"""
import re
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"


def tables(text):
    """Every markdown table in `text`, as a list of rows, each a dict of header -> cell."""
    found, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[-| ]+\|$", lines[i + 1]):
            header = [cell.strip() for cell in lines[i].strip("|").split("|")]
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                cells = [cell.strip() for cell in lines[i].strip("|").split("|")]
                rows.append(dict(zip(header, cells)))
                i += 1
            found.append(rows)
        else:
            i += 1
    return found


def number(cell):
    """The first number in a cell ('30.19 of 31.34 GB/s' -> 30.19), or None."""
    match = re.search(r"-?\d+(?:\.\d+)?", cell or "")
    return float(match.group()) if match else None


def percent(cell):
    match = re.search(r"(\d+)%", cell or "")
    return int(match.group(1)) if match else None


def plot_xemem(plt):
    from matplotlib import ticker

    source = RESULTS / "xemem-attach.md"
    rows = [row for table in tables(source.read_text()) for row in table if "mode" in row and "MiB" in row]
    ratio, attach = {}, {}
    for row in rows:
        path = row.get("direction", "host → host")
        size = number(row["MiB"])
        if row.get("backing") != "2m":
            continue
        if row["mode"] == "attach + read" and percent(row.get("attach+read / local read")) is not None:
            ratio.setdefault(path, []).append((size, percent(row["attach+read / local read"])))
        if row["mode"].startswith("attach (eager") or row["mode"] == "attach, prefaulted":
            attach.setdefault(path, []).append((size, number(row["ours GB/s"])))
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for path, points in sorted(ratio.items()):
        left.plot(*zip(*sorted(points)), marker="o", label=path)
    left.axhline(90, color="red", linestyle="--", label="issue target: 90%")
    left.set(xscale="log", xlabel="region (MiB)", ylabel="attach + read / local read (%)", ylim=(0, 110),
             title="Attach + read, 2 MiB backing")
    for path, points in sorted(attach.items()):
        right.plot(*zip(*sorted(points)), marker="o", label=path)
    right.axhline(12.8, color="gray", linestyle=":", label="paper, 1 GiB (Table 2): 12.8 GB/s")
    right.hlines(100, 800, 1300, color="red", linestyle="--", label="issue target at 1 GiB: 100 GB/s")
    right.set(xscale="log", yscale="log", xlabel="region (MiB)", ylabel="GB/s",
              title="Attach, every page mapped (eager / prefaulted)")
    for axes in (left, right):
        axes.xaxis.set_minor_locator(ticker.NullLocator())
        axes.set_xticks([128, 256, 512, 1024], labels=["128", "256", "512", "1024"])
        axes.legend(fontsize=7)
        axes.grid(alpha=0.3)
    figure.suptitle(f"XEMEM attach ({source.name})", fontsize=10)
    figure.tight_layout()
    return figure, RESULTS / "xemem-attach.png"


def plot_dex_scaling(plt):
    source = RESULTS / "dex-bench.md"
    rows = next(table for table in tables(source.read_text()) if table and "DEX speed-up" in table[0])
    labels = [row["app"] for row in rows]
    speedups = [number(row["DEX speed-up"]) for row in rows]
    ceilings = [number(row["plain, 2 threads, 1 node (machine ceiling)"].split("(")[1]) for row in rows]
    figure, axes = plt.subplots(figsize=(11, 4.6))
    positions = range(len(rows))
    colors = ["tab:green" if "naive" not in label else "tab:orange" for label in labels]
    axes.bar([p - 0.2 for p in positions], speedups, width=0.4, color=colors, label="DEX, 2 nodes × 1 thread")
    axes.bar([p + 0.2 for p in positions], ceilings, width=0.4, color="lightgray",
             label="plain, 2 threads on 1 node (this machine's ceiling)")
    axes.axhline(1.8, color="red", linestyle="--", label="issue target (optimised EP, KMN, BLK): 1.8×")
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks(list(positions), labels=[re.sub(r" \(.*", "", label) for label in labels], rotation=30,
                    ha="right", fontsize=8)
    axes.set(ylabel="speed-up over the plain program, 1 thread", title="DEX scaling, 1 → 2 nodes (cf. Fig. 2)")
    axes.legend(fontsize=8)
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    return figure, RESULTS / "dex-scaling.png"


def plot_dex_latency(plt):
    from matplotlib import ticker

    source = RESULTS / "dex-bench.md"
    found = tables(source.read_text())
    migration = next(table for table in found if table and "first forward" in table[0].get("", ""))
    faults = next(table for table in found if table and table[0].get("", "").startswith("read fault"))
    wanted = [(migration, "first forward"), (migration, "later forward"), (migration, "first backward"),
              (migration, "later backward"), (faults, "read fault, page at the origin")]
    # Both tables have the same columns in the same order (what, DEX, our configurations,
    # target), named a little differently: the migration table's names label them.
    columns = list(migration[0])[2:-1]
    figure, axes = plt.subplots(figsize=(11, 4.6))
    width = 0.8 / (len(columns) + 1)
    for k, (table, metric) in enumerate(wanted):
        row = next(row for row in table if row[""].startswith(metric))
        cells = list(row.values())
        paper = number(cells[1])
        axes.bar(k - 0.4 + width / 2, paper, width=width, color="black", label="DEX (paper)" if k == 0 else None)
        for j, (column, cell) in enumerate(zip(columns, cells[2:-1])):
            value = number(cell)
            if value is not None:
                axes.bar(k - 0.4 + width * (j + 1.5), value, width=width, color=f"C{j}",
                         label=re.sub(r"clowder dex,? |`", "", column) if k == 0 else None)
        target = number(row.get("issue target"))
        if target:
            axes.hlines(target, k - 0.45, k + 0.45, color="red", linestyle="--",
                        label="issue target" if k == 0 else None)
    axes.set_xticks(range(len(wanted)), labels=[metric for _, metric in wanted], fontsize=8)
    axes.set(yscale="log", ylabel="µs (median)", title="DEX migration and 4 KiB remote fault latency (cf. Table II)")
    axes.yaxis.set_major_formatter(ticker.ScalarFormatter())
    axes.yaxis.set_minor_formatter(ticker.NullFormatter())
    axes.set_yticks([10, 20, 40, 100, 200, 400, 800])
    axes.legend(fontsize=6.5, ncol=2)
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    return figure, RESULTS / "dex-latency.png"


def plot_lwk_detours(plt):
    source = RESULTS / "lwk-detours.tsv"
    sides = {}
    for line in source.read_text().splitlines()[1:]:
        side, at_us, length_us = line.split("\t")
        sides.setdefault(side, []).append((float(at_us) / 1e6, float(length_us)))
    figure, panels = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for axes, side in zip(panels, ("host", "enclave")):
        points = sides.get(side, [])
        if points:
            axes.scatter(*zip(*points), s=3, color="tab:blue" if side == "host" else "tab:green")
        lost = sum(length for _, length in points) / 1e3
        axes.set(yscale="log", xlabel="time (s)", title=f"{side}: {len(points)} detours, {lost:.1f} ms lost")
        axes.grid(alpha=0.3)
    panels[0].set_ylabel("detour (µs)")
    figure.suptitle("Selfish detour, the same static binary on the host and in an LWK enclave (lwk-bench.md)",
                    fontsize=10)
    figure.tight_layout()
    return figure, RESULTS / "lwk-detours.png"


def plot_adios2(plt):
    source = RESULTS / "adios2.md"
    rows = [row for table in tables(source.read_text()) for row in table if "engine" in row]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for side, axes in (("writer", left), ("reader", right)):
        for engine in dict.fromkeys(row["engine"] for row in rows):
            points = [(number(row["MiB"]), number(row[f"{side} ms (median)"])) for row in rows
                      if row["engine"] == engine and row[f"{side} ms (median)"] != "-"]
            if points:
                axes.plot(*zip(*sorted(points)), marker="o", label=engine)
        axes.set(xscale="log", yscale="log", xlabel="step (MiB)", ylabel="ms per step (median)",
                 title=f"ADIOS2 {side}'s step")
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
    figure.tight_layout()
    return figure, RESULTS / "adios2.png"


def plot_mpi(plt):
    source = RESULTS / "mpi.md"
    found = [table for table in tables(source.read_text()) if table and "bytes" in table[0]]
    units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20}
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for rows, side, label in ((found[0], axes[0], "latency (us)"), (found[1], axes[1], "bandwidth (MB/s)")):
        for case in [header for header in rows[0] if header != "bytes"]:
            points = [(number(row["bytes"]) * units[row["bytes"].split()[1]], number(row[case])) for row in rows
                      if row[case] != "-"]
            if points:
                side.plot(*zip(*points), marker="o", markersize=3, label=case.rsplit(" ", 1)[0])
        side.set(xscale="log", yscale="log", xlabel="message (bytes)", ylabel=label, title=f"MPI ping-pong {label.split()[0]}")
        side.grid(alpha=0.3)
        side.legend(fontsize=8)
    figure.tight_layout()
    return figure, RESULTS / "mpi.png"


FIGURES = {"xemem": [plot_xemem], "dex": [plot_dex_scaling, plot_dex_latency], "lwk": [plot_lwk_detours],
           "adios2": [plot_adios2], "mpi": [plot_mpi]}


def main(argv):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench/plot.py: matplotlib is not installed (pip install matplotlib); no figures drawn", file=sys.stderr)
        return 0
    names = argv or list(FIGURES)
    unknown = [name for name in names if name not in FIGURES]
    if unknown:
        print(f"bench/plot.py: unknown figure set '{unknown[0]}' (known: {', '.join(FIGURES)})", file=sys.stderr)
        return 2
    for name in names:
        for draw in FIGURES[name]:
            try:
                figure, path = draw(plt)
            except (OSError, StopIteration, KeyError, ValueError) as error:
                print(f"bench/plot.py: {draw.__name__}: results not readable ({error!r}); skipped", file=sys.stderr)
                continue
            figure.savefig(path, dpi=110)
            plt.close(figure)
            print(f"wrote {path.relative_to(RESULTS.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
