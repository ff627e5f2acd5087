#!/usr/bin/env python3
"""The in-situ results page (docs/results/insitu.md) and its figures, from the TSVs that
bench/insitu/run.sh wrote under docs/results/insitu/:

    bench/insitu/results.py docs/results/insitu > docs/results/insitu.md

matrix.tsv        config workflow run total compute publish wait data_mb status   (Fig. 8)
interference.tsv  load placement, then matrix.tsv's columns                       (Hobbes)
noise.tsv         detour SIZE AT_US LENGTH_US | attach SIZE AT_S US | summary SIZE TEXT (Fig. 7)
scaling.tsv       PAIRS PAIR MEDIAN_US GB/S                                        (Fig. 6)
machine.tsv       PART DATE CPUS MODEL LOAD SETTINGS

Draws insitu-matrix.png, insitu-interference.png, insitu-noise.png and insitu-scaling.png
beside the page with matplotlib; a part whose TSV is missing is left out.
"""
import statistics
import sys
from pathlib import Path

CONFIGS = {
    "host-xemem": "(a) both on the host, libxpmem",
    "host-files": "(b) both on the host, POSIX files",
    "lwk-host": "(c) sim in LWK, analytics on host",
    "lwk-lwk": "(d) sim and analytics in two LWKs",
    "lwk-linux": "(e) sim in LWK, analytics in a Linux VM",
}
WORKFLOWS = ["sync-once", "async-once", "sync-recurring", "async-recurring"]
PLACEMENTS = {
    "host-process": "host process",
    "lwk-enclave": "LWK enclave",
    "lwk-isolated": "LWK enclave, --isolate-cores",
}
LOADS = {
    "idle": "none",
    "cpu-memory": "stress-ng --cpu N --vm 1 (1 GiB)",
    "page-cache": "stress-ng --hdd N (512 MiB files)",
    "fork-burst": "stress-ng --fork N",
}
SIZES = ["baseline", "4KiB", "2MiB", "1GiB"]


def rows(path):
    if not path.exists():
        return []
    return [line.rstrip("\n").split("\t") for line in path.read_text().splitlines() if line.strip()]


def number(text):
    try:
        value = float(text)
    except ValueError:
        return None
    return None if value != value else value  # nan: no number


def stats(values):
    """mean, sd (sample), n of the numbers among values."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None, 0
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0, len(values)


def cell(mean, sd, n, unit=" s"):
    return "–" if mean is None else f"{mean:.3f} ± {sd:.3f}{unit} ({n})"


def pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        return plt
    except ImportError:
        return None


def machine(directory):
    found = {}
    for fields in rows(directory / "machine.tsv"):
        if len(fields) >= 6:
            found[fields[0]] = fields[1:]
    return found


def header(info, part):
    if part not in info:
        return ""
    date, cpus, model, load, settings = info[part][:5]
    return f"Run {date} on {cpus} ({model}), {load} at the start; `{settings}`.\n"


def matrix_part(directory, info, plt):
    data = rows(directory / "matrix.tsv")
    if not data:
        return []
    out = ["## Fig. 8: the in-situ matrix", "", header(info, "matrix")]
    results, unavailable = {}, {}
    for config, workflow, _run, total, compute, publish, wait, data_mb, status in (r[:9] for r in data):
        if status.startswith("not available"):
            unavailable[config] = status
            continue
        entry = results.setdefault((config, workflow), {"total": [], "publish": [], "wait": [], "failed": 0})
        if status == "verified":
            entry["total"].append(number(total))
            entry["publish"].append(number(publish))
            entry["wait"].append(number(wait))
        else:
            entry["failed"] += 1
    settings = dict(item.split("=", 1) for item in info.get("matrix", [""] * 5)[4].split() if "=" in item)
    iterations, interval = int(settings.get("ITERATIONS", 600)), int(settings.get("INTERVAL", 40))
    data_mb = {r[7] for r in data if not r[8].startswith("not available")}
    out.append(
        f"Simulation runtime (setup + {iterations} CG iterations + {iterations // interval} publications of"
        f" {' / '.join(sorted(data_mb, key=int))} MiB), mean ± sd (runs whose data verified):"
    )
    out.append("")
    out.append("| configuration | " + " | ".join(WORKFLOWS) + " |")
    out.append("|---|" + "---|" * len(WORKFLOWS))
    for config, label in CONFIGS.items():
        if config in unavailable:
            out.append(f"| {label} | {unavailable[config]} |" + " |" * (len(WORKFLOWS) - 1))
            continue
        if not any((config, w) in results for w in WORKFLOWS):
            continue
        cells = []
        for workflow in WORKFLOWS:
            entry = results.get((config, workflow))
            text = cell(*stats(entry["total"])) if entry else "–"
            if entry and entry["failed"]:
                text += f", {entry['failed']} FAILED"
            cells.append(text)
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    out.append("")
    out.append("Of which publishing (staging the data; recurring: also making and removing the interval's region or file)")
    out.append("and waiting for the analytics, mean seconds per run:")
    out.append("")
    out.append("| configuration | " + " | ".join(WORKFLOWS) + " |")
    out.append("|---|" + "---|" * len(WORKFLOWS))
    for config, label in CONFIGS.items():
        if config in unavailable or not any((config, w) in results for w in WORKFLOWS):
            continue
        cells = []
        for workflow in WORKFLOWS:
            entry = results.get((config, workflow))
            publish_mean, wait_mean = (stats(entry["publish"])[0], stats(entry["wait"])[0]) if entry else (None, None)
            cells.append("–" if publish_mean is None else f"publish {publish_mean:.2f}, wait {wait_mean:.2f}")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    out.append("")
    out.append("Paper (XEMEM, HPDC'15, Fig. 8; i7 4 cores, HPCCG 600 iterations + STREAM over 512 MB, 10 runs): the")
    out.append("figure gives bars without numbers in the text; its findings: async is faster than sync everywhere; Kitten")
    out.append("simulation + native Linux analytics is the fastest configuration in both models; with async every Kitten")
    out.append("configuration beats Linux-only; every multi-enclave configuration is steadier than Linux-only; recurring +")
    out.append("sync is the worst case for virtualized analytics, and Linux-only also slows down with a marked rise in")
    out.append("variance under recurring attachment. Hobbes slides (LAMMPS + Bonds, Cray XK7): POSIX files 165.02 s (sd")
    out.append("0.20), XEMEM 153.48 s (sd 0.08).")
    out.append("")
    out.append("![Fig. 8 here](insitu/insitu-matrix.png)")
    out.append("")
    if plt:
        figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        configs = [c for c in CONFIGS if any((c, w) in results for w in WORKFLOWS)]
        for axis, model in zip(axes, ["once", "recurring"]):
            width = 0.38
            for k, sync in enumerate(["sync", "async"]):
                means, sds = [], []
                for config in configs:
                    mean, sd, _ = stats(results.get((config, f"{sync}-{model}"), {"total": []})["total"])
                    means.append(mean or 0)
                    sds.append(sd or 0)
                positions = [i + (k - 0.5) * width for i in range(len(configs))]
                axis.bar(positions, means, width, yerr=sds, capsize=4, label=sync)
            axis.set_xticks(range(len(configs)))
            axis.set_xticklabels([CONFIGS[c].split(")")[0] + ")\n" + c for c in configs])
            axis.set_title(f"{'One-time' if model == 'once' else 'Recurring'} attachment")
            axis.set_ylabel("simulation runtime (s), mean ± sd")
            axis.legend()
        for config in unavailable:
            axes[0].annotate(f"{config}: not available", xy=(0.02, 0.95), xycoords="axes fraction", fontsize=8)
        runs = max(int(r[2]) for r in data)
        figure.suptitle(f"In-situ CG + STREAM, {runs} runs each (cf. XEMEM Fig. 8)")
        figure.tight_layout()
        figure.savefig(directory / "insitu-matrix.png", dpi=110)
        plt.close(figure)
    return out, results


def interference_part(directory, info, plt):
    data = rows(directory / "interference.tsv")
    if not data:
        return []
    out = ["## Isolation under interference (Hobbes)", "", header(info, "interference")]
    results = {}
    for fields in data:
        load, placement, status = fields[0], fields[1], fields[10]
        entry = results.setdefault((load, placement), {"total": [], "compute": [], "failed": 0})
        if status == "verified":
            entry["total"].append(number(fields[5]))
            entry["compute"].append(number(fields[6]))
        else:
            entry["failed"] += 1
    out.append("Asynchronous, one-time workflow (configuration (a) as the host process, (c) as the enclave); the analytics")
    out.append("on the host in every case. Runtime mean ± sd (runs), the sd of the CG compute time alone, and the enclave's")
    out.append("runtime sd as a fraction of the host process's under the same load (goal: at most 1/3):")
    out.append("")
    out.append("| neighbour on the host | " + " | ".join(PLACEMENTS.values()) + " | sd ratio: enclave / host | isolated / host |")
    out.append("|---|" + "---|" * (len(PLACEMENTS) + 2))
    for load, label in LOADS.items():
        if not any((load, p) in results for p in PLACEMENTS):
            continue
        cells, sds = [], {}
        for placement in PLACEMENTS:
            entry = results.get((load, placement))
            if not entry:
                cells.append("–")
                continue
            mean, sd, n = stats(entry["total"])
            _, compute_sd, _ = stats(entry["compute"])
            sds[placement] = sd
            text = cell(mean, sd, n)
            if compute_sd is not None:
                text += f"; compute sd {compute_sd:.3f}"
            if entry["failed"]:
                text += f"; {entry['failed']} FAILED"
            cells.append(text)
        ratio = lambda p: (f"{sds[p] / sds['host-process']:.2f}" if sds.get(p) is not None and sds.get("host-process") else "–")
        out.append(f"| {label} | " + " | ".join(cells) + f" | {ratio('lwk-enclave')} | {ratio('lwk-isolated')} |")
    out.append("")
    out.append("![interference](insitu/insitu-interference.png)")
    out.append("")
    if plt:
        loads = [load for load in LOADS if any((load, p) in results for p in PLACEMENTS)]
        figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
        width = 0.27
        for k, (placement, label) in enumerate(PLACEMENTS.items()):
            means, sds = [], []
            for load in loads:
                mean, sd, _ = stats(results.get((load, placement), {"total": []})["total"])
                means.append(mean or 0)
                sds.append(sd or 0)
            positions = [i + (k - 1) * width for i in range(len(loads))]
            left.bar(positions, means, width, yerr=sds, capsize=3, label=label)
            right.bar(positions, sds, width, label=label)
        for axis, title, ylabel in ((left, "Runtime, mean ± sd", "s"), (right, "Runtime standard deviation", "sd (s)")):
            axis.set_xticks(range(len(loads)))
            axis.set_xticklabels(loads)
            axis.set_title(title)
            axis.set_ylabel(ylabel)
        right.axhline(0.20, color="gray", linestyle=":", label="Hobbes slides: one OS, sd 0.20 s")
        right.axhspan(0.03, 0.15, color="green", alpha=0.1, label="Hobbes slides: enclaves, sd 0.03-0.15 s")
        left.legend(fontsize=8)
        right.legend(fontsize=8)
        figure.tight_layout()
        figure.savefig(directory / "insitu-interference.png", dpi=110)
        plt.close(figure)
    return out, results


def noise_part(directory, info, plt):
    data = rows(directory / "noise.tsv")
    if not data:
        return []
    out = ["## Fig. 7: attach noise in a 1-core LWK enclave", "", header(info, "noise")]
    detours = {size: [] for size in SIZES}
    attaches = {size: [] for size in SIZES}
    summaries = {size: [] for size in SIZES}
    for fields in data:
        kind, size = fields[0], fields[1]
        if size not in detours:
            continue
        if kind == "detour":
            detours[size].append(float(fields[3]))
        elif kind == "attach":
            attaches[size].append(float(fields[3]))
        elif kind == "summary":
            summaries[size].append(fields[2])
    base = max(detours["baseline"]) if detours["baseline"] else None
    out.append("selfish-detour for 12 s in the enclave (its loop exporting 1 GiB of its memory); a host process attaches")
    out.append("the first 4 KiB, 2 MiB or 1 GiB of it, reads a word, detaches and releases, once a second, 10 times:")
    out.append("")
    out.append("| attached | detours | median detour | 99th pct | largest | largest / baseline's largest | attach (median) |")
    out.append("|---|---|---|---|---|---|---|")
    for size in SIZES:
        lengths = sorted(detours[size])
        if not lengths and not summaries[size]:
            continue
        p99 = lengths[min(len(lengths) - 1, int(0.99 * len(lengths)))] if lengths else None
        largest = lengths[-1] if lengths else None
        ratio = f"{largest / base:.1f}x" if largest and base else "–"
        attach = f"{statistics.median(attaches[size]):.0f} us" if attaches[size] else "–"
        fmt = lambda v: "–" if v is None else f"{v:.1f} us"
        out.append(f"| {size} | {len(lengths)} | {fmt(statistics.median(lengths) if lengths else None)} | {fmt(p99)} | "
                   f"{fmt(largest)} | {ratio} | {attach} |")
    out.append("")
    out.append("Paper (Fig. 7, Kitten on one core): baseline detours around 12 us (frequent) and 100 us (rare, SMIs);")
    out.append("4 KiB attaches invisible in that baseline, 2 MiB ones below the 100 us events, 1 GiB attaches detours")
    out.append("two orders of magnitude longer than any other.")
    out.append("")
    out.append("![Fig. 7 here](insitu/insitu-noise.png)")
    out.append("")
    if plt:
        figure, axes = plt.subplots(1, len(SIZES), figsize=(14, 3.6), sharey=True)
        everything = [v for size in SIZES for v in detours[size]]
        if everything:
            low, high = max(min(everything), 0.5), max(everything) * 1.2
            bins = [low * (high / low) ** (i / 40) for i in range(41)]
            for axis, size in zip(axes, SIZES):
                if detours[size]:
                    axis.hist(detours[size], bins=bins, log=True)
                axis.set_xscale("log")
                axis.set_title(f"{size} attaches" if size != "baseline" else "no attaches (baseline)")
                axis.set_xlabel("detour length (us)")
            axes[0].set_ylabel("detours")
        figure.suptitle("Selfish-detour in a 1-core LWK enclave while a host process attaches its memory (cf. XEMEM Fig. 7)")
        figure.tight_layout()
        figure.savefig(directory / "insitu-noise.png", dpi=110)
        plt.close(figure)
    return out, (detours, attaches, base)


def scaling_part(directory, info, plt):
    data = rows(directory / "scaling.tsv")
    if not data:
        return []
    out = ["## Fig. 6: attach throughput with concurrent enclave/attacher pairs", "", header(info, "scaling")]
    per = {}
    failed = {}
    for fields in data:
        pairs = int(fields[0])
        if fields[2] == "failed":
            failed.setdefault(pairs, []).append(fields[3] if len(fields) > 3 else "")
            continue
        per.setdefault(pairs, []).append((float(fields[2]), float(fields[3])))
    settings = info.get("scaling", [""] * 5)[4]
    mib = next((w.split("=")[1] for w in settings.split() if w.startswith("PAIR_MIB=")), "?")
    out.append(f"Each pair: a 1-core LWK enclave whose job exports {mib} MiB, and a host process attaching all of it back to")
    out.append("back (get + attach timed, then a word read, detach, release). **This machine has 2 cores**: 1 and 2 pairs")
    out.append("give each enclave a core of its own (the attachers share the cores with them); 4 and 8 pairs put 2 and 4")
    out.append("enclaves on each core (four daemons, two enclaves each), oversubscribed.")
    out.append("")
    out.append("The aggregate counts every attach, the first (cold) one of each pair included; the last column is the")
    out.append("region's size over the median attach, summed over the pairs.")
    out.append("")
    out.append("| pairs | aggregate GB/s | per pair GB/s (mean) | median get + attach (mean of pairs) | failed pairs | aggregate at the median |")
    out.append("|---|---|---|---|---|---|")
    for pairs in sorted(set(per) | set(failed)):
        values = per.get(pairs, [])
        total = sum(v[1] for v in values)
        mean = total / len(values) if values else 0
        median = statistics.mean(v[0] for v in values) if values else 0
        at_median = sum(float(mib) * 2**20 / v[0] / 1e3 for v in values) if mib != "?" else 0
        out.append(f"| {pairs} | {total:.2f} | {mean:.2f} | {median:.0f} us | {len(failed.get(pairs, []))} | {at_median:.1f} GB/s |")
    out.append("")
    out.append("Paper (Fig. 6; 1-8 Kitten enclaves of 1 core each on a 24-thread machine, 128 MB-1 GB regions): aggregate")
    out.append("throughput grows with the number of enclaves (about 13 GB/s per pair at 1 GiB, Fig. 5), i.e. attaches do")
    out.append("not serialise across enclaves.")
    out.append("")
    out.append("![Fig. 6 here](insitu/insitu-scaling.png)")
    out.append("")
    if plt and per:
        figure, axis = plt.subplots(figsize=(6, 4))
        xs = sorted(per)
        axis.plot(xs, [sum(v[1] for v in per[x]) for x in xs], marker="o", label="aggregate")
        axis.plot(xs, [sum(v[1] for v in per[x]) / len(per[x]) for x in xs], marker="s", label="per pair")
        axis.axvline(2, color="gray", linestyle=":", label="cores on this machine")
        axis.set(xscale="log", xlabel="enclave/attacher pairs", ylabel="GB/s (get + attach)", xticks=xs)
        axis.set_xticklabels([str(x) for x in xs])
        axis.set_title(f"Attach throughput, {mib} MiB regions (cf. XEMEM Fig. 6)")
        axis.legend()
        figure.tight_layout()
        figure.savefig(directory / "insitu-scaling.png", dpi=110)
        plt.close(figure)
    return out, per


def main():
    directory = Path(sys.argv[1])
    plt = pyplot()
    info = machine(directory)
    lines = [
        "# In-situ composition, isolation, attach noise and scaling (XEMEM HPDC'15 Figs. 6-8, Hobbes)",
        "",
        "Produced by `make bench-insitu` (`bench/insitu/run.sh`; the raw TSVs beside the figures in",
        "[insitu/](insitu/)). `scripts/insitu.sh --check` (in `make test`) runs every configuration x workflow at a",
        "small size and checks each interval's data by checksum; `make demo` runs two of them once.",
        "",
    ]
    # The paragraphs comparing each figure with the paper, written after the run it discusses.
    notes = directory / "discussion.md"
    discussion = notes.read_text() if notes.exists() else ""
    for part in (matrix_part, interference_part, noise_part, scaling_part):
        produced = part(directory, info, plt)
        if produced:
            lines.extend(produced[0])
    if not plt:
        lines.append("(matplotlib is not installed: no figures were drawn.)")
    if discussion:
        lines.append(discussion)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
