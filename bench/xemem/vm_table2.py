#!/usr/bin/env python3
"""XEMEM Table 2's Linux-VM rows from vm_attach_bench's output (bench/xemem/vm-table2.sh).

    vm_table2.py LOG [LOG...] --date D --load-before L --load-after L --elapsed S --commit C --machine M
                 --sizes MIBS --vm-owner-max MIB --lwk 0|1 --backings WORDS
                 [--write RESULTS.md] [--figure PNG]

LOG holds the test's `row DIRECTION ...` lines (attach_bench's: `MODE MIB ITERATIONS GB/S
MEDIAN_US DETACH_US LOCAL_GB/S LOCAL_MIB REREAD_GB/S`, `first MODE MIB US`, `owner-read MIB
GB/S`), `NAME: create to ready: S s`, `vm-owner made NAME MIB S`, `vmm-memory KEY: N kB` and `vm-ram MIB MiB on SIZE pages` (also
`lwk-ram`).
Each (direction, size, mode) was measured in RUNS runs, each a new segment: the tables give the
median over the runs of each run's median (and of each run's first iteration). A direction and
size the settings (the benchmark's: --sizes and the rest) leave out, or the log has no row of,
gets a row that says so and why. Several LOGs (runs of the benchmark with different settings, e.g.
the VM-owner rows apart) are read as one: their runs add up, and the settings given are the
union of theirs. Prints the markdown; --write puts it between
the `<!-- vm-table2 begin -->` and `<!-- vm-table2 end -->` lines of RESULTS.md (appended with
them if absent); --figure draws attach and attach + read throughput by size (matplotlib).
"""
import argparse
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

BEGIN, END = "<!-- vm-table2 begin -->", "<!-- vm-table2 end -->"
DIRECTIONS = {"host-2m->vm": "host → VM", "host-4k->vm": "host (4 KiB) → VM", "lwk->vm": "LWK → VM",
              "vm->host": "VM → host", "vm->lwk": "VM → LWK", "vm->vm": "VM → VM"}
# Table 2 (Kocoloski et al., HPDC'15): 1 GB, at least 500 attachments, GB/s.
PAPER = {"lwk->vm": "3.99 (8.79 w/o rb-tree)", "host-2m->vm": "3.99 (Kitten → Linux VM)",
         "vm->lwk": "12.61 (Linux VM → Kitten)", "vm->host": "–", "host-4k->vm": "–", "vm->vm": "–"}


def parse(paths):
    rows, firsts, boots, memory, made = defaultdict(list), defaultdict(list), [], [], []
    ram = []
    lines = [(path, line) for path in paths for line in Path(path).read_text(errors="replace").splitlines()]
    for path, line in lines:
        fields = line.split()
        if line.startswith("row ") and len(fields) >= 3:
            direction, kind = fields[1], fields[2]
            if kind == "first" and len(fields) == 6:
                firsts[(direction, int(fields[4]), fields[3])].append(float(fields[5]))
            elif kind in ("attach", "read") and len(fields) == 11:
                mib, iterations, gbs, median, detach, local, local_mib, reread = fields[3:]
                rows[(direction, int(mib), kind)].append(
                    {"iterations": int(iterations), "median": float(median), "detach": float(detach),
                     "local": float(local), "local_mib": int(local_mib), "reread": float(reread)})
        elif m := re.match(r"(\S+): create to ready: (\d+) s", line):
            boots.append((m.group(1), int(m.group(2))))
        elif m := re.match(r"vmm-memory (\w+):\s+(\d+) kB", line):
            # One VMM's figures per log.
            if not memory or memory[-1][0] != path:
                memory.append((path, {}))
            memory[-1][1][m.group(1)] = int(m.group(2))
        elif m := re.match(r"vm-owner made (\S+) (\d+) ([\d.]+)$", line):
            made.append((m.group(1), int(m.group(2)), float(m.group(3))))
        elif m := re.match(r"(vm|lwk)-ram (\d+) MiB on (.+) pages$", line):
            # vm-table2.sh's second VM (FILE.owners) holds the VM-owner rows.
            rows_of = "the VM-owner rows" if str(path).endswith(".owners") else "the rows into the VM"
            ram.append(f"{'the VM' if m.group(1) == 'vm' else 'the LWK'} {m.group(2)} MiB on {m.group(3)} pages ({rows_of})")
    return rows, firsts, boots, (memory, ram), made


def gbs(mib, us):
    return mib * (1 << 20) / (us * 1e-6) / 1e9 if us > 0 else 0.0


def med(values):
    return statistics.median(values) if values else 0.0


def left_out(direction, mib, options):
    """Why the settings leave (direction, mib) out, or None if they ask for it."""
    if direction == "vm->vm":
        return ("vm_attach_bench boots one VM (a boot is minutes here); VM → VM is checked by content at 1 MiB by "
                "`make test-linux-xemem`")
    if direction.startswith("host-") and direction[5:7] not in options.backings.split():
        return f"BACKINGS has no {direction[5:7]}"
    if "lwk" in direction and options.lwk != "1":
        return "LWK=0"
    if direction.startswith("vm->") and mib > options.vm_owner_max:
        return (f"above VM_OWNER_MAX={options.vm_owner_max} MiB (a VM owner's pages are first touched in emulated "
                "guest kernel code)")
    return None


def summary(rows, firsts, options):
    """One dict per (direction, size): medians over the runs, or why there are none."""
    sizes = {int(mib) for mib in options.sizes.split()}
    # host (4 KiB) → VM is not one of Table 2's rows: listed only when asked for or measured.
    wanted = {(d, m) for d in DIRECTIONS for m in sizes if d != "host-4k->vm" or "4k" in options.backings.split()}
    out = []
    for (direction, mib) in sorted({(d, m) for d, m, _ in rows} | wanted, key=lambda k: (list(DIRECTIONS).index(k[0]) if k[0] in DIRECTIONS else 99, k[1])):
        attach, read = rows.get((direction, mib, "attach"), []), rows.get((direction, mib, "read"), [])
        entry = {"direction": direction, "mib": mib, "runs": max(len(attach), len(read))}
        if not attach and not read:
            entry["not_measured"] = left_out(direction, mib, options) or options.stopped
        if attach:
            entry["attach_us"] = med([r["median"] for r in attach])
            entry["attach_first_us"] = med(firsts.get((direction, mib, "attach"), []))
            entry["iterations"] = attach[0]["iterations"]
            # The best of three reads before any attach: the VM's local read undisturbed.
            entry["local"] = med([r["local"] for r in attach])
            entry["local_mib"] = attach[0]["local_mib"]
        if read:
            entry["read_us"] = med([r["median"] for r in read])
            entry["read_first_us"] = med(firsts.get((direction, mib, "read"), []))
            entry["local_between"] = med([r["local"] for r in read])
            entry.setdefault("local_mib", read[0]["local_mib"])
            entry["reread"] = med([r["reread"] for r in read])
            entry["detach_us"] = med([r["detach"] for r in read])
            entry["reads"] = read[0]["iterations"]
        out.append(entry)
    return out


def cell_time(us, mib):
    if not us:
        return "–"
    return f"{us / 1e3:.2f} ms ({gbs(mib, us):.2f} GB/s)" if us < 1e6 else f"{us / 1e6:.2f} s ({gbs(mib, us):.2f} GB/s)"


def owner_makes(made):
    """The bench's wait for the VM owner's make of each size's first segment (its new pages
    written, mlock, pagemap, the daemon's make; the very first from the job's start) and the
    median of the later ones (a later run's first is made while other directions run)."""
    by_size = defaultdict(list)
    for _, mib, seconds in made:
        by_size[mib].append(seconds)
    parts = [f"{mib} MiB {times[0]:.0f} s" + (f", then {med(times[1:]):.1f} s" if len(times) > 1 else "")
             for mib, times in sorted(by_size.items())]
    return ("The VM owner (one `attach_bench serve` job for all VM-owner segments, its region's pages written as the "
            "sizes first need them): the wait for its make after the previous attacher (the very first from the job's "
            "start), each size's first and then the median of the rest: " + "; ".join(parts) + ".")


def markdown(entries, boots, memory_and_ram, made, options):
    memory, ram = memory_and_ram
    out = [f"Generated by `bench/xemem/vm-table2.sh` on {options.date} ({options.machine}; load average "
           f"{options.load_before} before, {options.load_after} after; {options.elapsed} s; commit {options.commit}). "
           "Each figure is the median over the runs (each run a new segment) of that run's median; *first* is the "
           "median of the runs' first iteration, the cost of a segment this VM had not attached before. "
           "*local read* is the attacher's read of a local buffer of that many MiB (a VM's: a tmpfs file the first "
           "job writes, in guest memory, 4 KiB pages in the guest as the window's mapping is; the host's and an "
           "LWK's: private memory): the best of three back to back before any attach, and the median "
           "of the reads interleaved with the attach + read iterations, one before each; *attach+read / local* "
           "compares the attach + read median with the interleaved local read, the two measured side by side in the "
           "same conditions (each after the previous iteration's gigabytes of reads, so neither finds its page walks "
           "in the caches, where the back-to-back reads do).", ""]
    out.append("| direction | MiB | runs | attach, median (GB/s) | first attach | attach + read, median (GB/s) | "
               "first attach + read | local read GB/s, before / between (MiB) | attach+read / local | re-read GB/s | detach | paper, 1 GB (GB/s) |")
    out.append("|" + "---|" * 12)
    for e in entries:
        if "not_measured" in e:
            out.append(f"| {DIRECTIONS.get(e['direction'], e['direction'])} | {e['mib']} | 0 | not measured: "
                       f"{e['not_measured']} |" + " – |" * 8)
            continue
        side_by_side = e.get("local_between") or e.get("local")
        ratio = f"{gbs(e['mib'], e['read_us']) / side_by_side * 100:.0f}%" if e.get("read_us") and side_by_side else "–"
        between = f" / {e['local_between']:.2f}" if "local_between" in e else ""
        local = f"{e['local']:.2f}{between} ({e['local_mib']})" if "local" in e else "–"
        reread = f"{e['reread']:.2f}" if e.get("reread") else "–"
        detach = f"{e['detach_us'] / 1e3:.2f} ms" if "detach_us" in e else "–"
        paper = PAPER.get(e["direction"], "–") if e["mib"] == 1024 else "–"
        out.append(f"| {DIRECTIONS.get(e['direction'], e['direction'])} | {e['mib']} | {e['runs']} | "
                   f"{cell_time(e.get('attach_us'), e['mib'])} | {cell_time(e.get('attach_first_us'), e['mib'])} | "
                   f"{cell_time(e.get('read_us'), e['mib'])} | {cell_time(e.get('read_first_us'), e['mib'])} | "
                   f"{local} | {ratio} | {reread} | {detach} | {paper} |")
    out.append("")
    if made:
        out.append(owner_makes(made))
    if ram:
        out.append("Enclave RAM: " + "; ".join(ram) + ".")
    if boots:
        out.append("Boot (create to ready): " + ", ".join(f"{name} {s} s" for name, s in boots) + ".")
    # Hugetlb pages are not counted in RSS: guest RAM on them leaves only the segments in RssShmem.
    for path, vmm in memory:
        on_hugepages = any(line.startswith("vm-ram") and "on 2 MiB pages" in line for line in Path(path).read_text(errors="replace").splitlines())
        shmem_holds = "mapped segments" if on_hugepages else "guest RAM and mapped segments"
        rss, shmem = vmm.get("VmRSS", 0), vmm.get("RssShmem", 0)
        out.append(f"The VMM's memory at the end: VmRSS {rss / 1024:.1f} MiB, of which RssShmem ({shmem_holds}) "
                   f"{shmem / 1024:.1f} MiB; beyond them RssAnon {vmm.get('RssAnon', 0) / 1024:.1f} MiB "
                   f"+ RssFile {vmm.get('RssFile', 0) / 1024:.1f} MiB.")
    out.append("")
    out.append("Figure: [xemem-vm.png](xemem-vm.png) (attach and attach + read by size, median and first).")
    return "\n".join(out)


def write_between_markers(path, text):
    path = Path(path)
    old = path.read_text() if path.exists() else ""
    block = f"{BEGIN}\n{text}\n{END}"
    if BEGIN in old and END in old:
        new = old[:old.index(BEGIN)] + block + old[old.index(END) + len(END):]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(new)


def figure(entries, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    entries = [e for e in entries if "not_measured" not in e]
    for direction in dict.fromkeys(e["direction"] for e in entries):
        mine = [e for e in entries if e["direction"] == direction]
        label = DIRECTIONS.get(direction, direction)
        for axis, key, style in ((left, "attach_us", "o-"), (left, "attach_first_us", "x:"), (right, "read_us", "o-"),
                                 (right, "read_first_us", "x:")):
            points = [(e["mib"], gbs(e["mib"], e[key])) for e in mine if e.get(key)]
            if points:
                axis.plot(*zip(*points), style, label=f"{label}{' (first)' if 'first' in key else ''}")
    # The VM attachers' local read, interleaved with their iterations as the table's ratio takes it.
    local = [e.get("local_between") or e["local"] for e in entries if e["direction"].endswith("->vm") and e.get("local")]
    if local:
        right.axhline(0.9 * med(local), color="grey", linestyle="--", label="90% of the VM's local read (interleaved)")
    left.axhline(100, color="grey", linestyle="--", label="target 100 GB/s")
    left.axhline(3.99, color="red", linestyle=":", label="paper: Kitten → Linux VM, 1 GB")
    for axis, title in ((left, "attach"), (right, "attach + read")):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("MiB")
        axis.set_ylabel("GB/s")
        axis.set_title(f"XEMEM into/out of a Linux VM (PVM): {title}")
        axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("log", nargs="+")
    for name in ("date", "load-before", "load-after", "elapsed", "commit", "machine"):
        parser.add_argument(f"--{name}", default="?")
    parser.add_argument("--sizes", default="128 256 512 1024")
    parser.add_argument("--vm-owner-max", type=int, default=256)
    parser.add_argument("--lwk", default="1")
    parser.add_argument("--backings", default="2m")
    parser.add_argument("--stopped", default="the run ended before this row (its log says why)",
                        help="why a row the settings asked for has no measurement")
    parser.add_argument("--write")
    parser.add_argument("--figure")
    options = parser.parse_args()
    rows, firsts, boots, memory, made = parse(options.log)
    if not rows:
        sys.exit(f"vm_table2: no rows in {' '.join(options.log)}: the benchmark did not get to measure (its output says why)")
    entries = summary(rows, firsts, options)
    text = markdown(entries, boots, memory, made, options)
    print(text)
    if options.write:
        write_between_markers(options.write, text)
    if options.figure:
        figure(entries, options.figure)


if __name__ == "__main__":
    main()
