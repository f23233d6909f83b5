#!/usr/bin/env python3
"""Plots `mapping bench --json` output: bandwidth against size, one line per
direction and memory kind (pageable, page-locked, device, bidirectional,
the memcpy baseline), with the min..max band of the runs, and the latency
bars. Where the report has the raw-driver section (opencl-raw, cuda-raw),
the driver's own large copies are drawn as dashed baseline lines: what the
library's copies should approach. Needs matplotlib (pip install matplotlib,
or apt-get install python3-matplotlib).

Bidirectional ("bidir locked"): an upload and a download of the same size at
once, on two streams; the GB/s counts the bytes of both. On a full-duplex
link (PCIe) it can approach twice a one-way figure; where both directions
share one memory bus (the host back end, a CPU OpenCL device) it cannot.

    mapping bench --only bandwidth,latency,opencl-raw --json > bench.json
    mapping-plot-bench bench.json bench.png --log-y     (installed)
    python3 scripts/plot_bench.py bench.json bench.png  (source tree)
"""
import argparse
import json
import re
import sys


def load(path):
    with open(path) if path != "-" else sys.stdin as f:
        report = json.load(f)
    tables = {t["id"]: t for t in report.get("tables", [])}
    return report, tables


# The raw-driver tables: (table id, column of the driver's GB/s).
RAW_TABLES = (("opencl_raw_bandwidth", "raw blocking", "raw OpenCL"), ("cuda_raw_bandwidth", "driver GB/s", "CUDA driver"))


def raw_baselines(tables):
    """[(label, GB/s)] of the driver's own copies, from the raw-driver sections."""
    lines = []
    for tid, col, who in RAW_TABLES:
        t = tables.get(tid)
        if not t or col not in t["columns"]:
            continue
        c = t["columns"].index(col)
        size = re.search(r"\d+ [KMG]iB", t.get("title", ""))
        for row in t["rows"]:
            if row[c] is None:
                continue
            label = row[0] if size is None or size.group(0) in row[0] else "%s %s" % (row[0], size.group(0))
            lines.append(("%s %s, blocking" % (who, label), row[c]))
    return lines


def plot_bandwidth(ax, table, baselines=(), log_y=False):
    cols = table["columns"][1:]
    sizes = table.get("sizes")
    if not sizes:
        raise SystemExit("the bandwidth table has no sizes: run a mapping bench that writes them (0.1 or later)")
    ranges = table.get("ranges")
    styles = {"pageable": "--", "locked": "-", "memcpy": ":"}
    for c, name in enumerate(cols):
        if "/" in name:  # ratio columns go elsewhere
            continue
        ys = [row[c + 1] for row in table["rows"]]
        style = next((v for k, v in styles.items() if k in name), "-")
        label = name + " (both directions' bytes)" if name.startswith("bidir") else name
        line, = ax.plot(sizes, ys, style, marker="o", markersize=3, label=label)
        if ranges:
            lo = [r[c][0] for r in ranges]
            hi = [r[c][1] for r in ranges]
            if all(v is not None for v in lo + hi):
                ax.fill_between(sizes, lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)
    for i, (label, gbps) in enumerate(baselines):
        ax.axhline(gbps, color="black", linestyle=(0, (6, 3 + 2 * i)), linewidth=1, alpha=0.7,
                   label="baseline: %s (%.3g GB/s)" % (label, gbps))
    ax.set_xscale("log", base=2)
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel("transfer size (bytes)")
    ax.set_ylabel("GB/s (1e9 bytes/s)" + (", log scale" if log_y else ""))
    ax.set_title("Bandwidth by size, direction and memory (median; band: min..max of runs)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    ticks = [s for s in sizes]
    ax.set_xticks(ticks)
    ax.set_xticklabels([human(s) for s in ticks], rotation=45, fontsize=7)


def human(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return "%d %s" % (n >> shift, unit)
    return "%d B" % n


def plot_latency(ax, table):
    labels = [row[0] for row in table["rows"]]
    values = [row[1] for row in table["rows"]]
    bars = ax.bar(labels, values, color=["tab:blue", "tab:orange", "tab:gray"][: len(values)])
    for bar, v in zip(bars, values):
        ax.annotate("%.3f" % v, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                    va="bottom", fontsize=8)
    ax.set_ylabel("microseconds (median)")
    ax.set_title("64-byte blocking copy latency", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", help="output of mapping bench --json ('-' for stdin)")
    ap.add_argument("png", help="the image to write")
    ap.add_argument("--log-y", action="store_true",
                    help="a logarithmic bandwidth axis (small copies stay readable next to large ones)")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("SKIP: matplotlib is not installed (pip install matplotlib)")
        return 77
    report, tables = load(args.json)
    if "bandwidth" not in tables:
        print("plot_bench.py: no bandwidth table in %s (run mapping bench with the bandwidth section)" % args.json,
              file=sys.stderr)
        return 1
    has_latency = "latency" in tables
    fig, axes = plt.subplots(1, 2 if has_latency else 1, figsize=(14 if has_latency else 9, 5.5),
                             gridspec_kw={"width_ratios": [3, 1]} if has_latency else None, squeeze=False)
    baselines = raw_baselines(tables)
    plot_bandwidth(axes[0][0], tables["bandwidth"], baselines, args.log_y)
    if has_latency:
        plot_latency(axes[0][1], tables["latency"])
    fig.suptitle("mapping %s bench: %s back end, %s (driver %s), %s" % (
        report.get("version", "?"), report.get("backend", "?"), report.get("device", "?"),
        report.get("driver", "?"), report.get("date", "?")), fontsize=10)
    notes = []
    if any(c.startswith("bidir") for c in tables["bandwidth"]["columns"]):
        notes.append("bidir: an upload and a download at once; GB/s counts the bytes of both directions "
                     "(up to 2x one way on a full-duplex link such as PCIe; not where both share one memory bus)")
    if not baselines and report.get("backend") == "host":
        notes.append("host back end: no driver to compare with; memcpy from/into is the baseline")
    elif not baselines:
        notes.append("no raw-driver baseline in this report: run mapping bench with the opencl-raw or cuda-raw "
                     "section too (--only bandwidth,latency,%s-raw)" % report.get("backend", "opencl"))
    if notes:
        fig.text(0.01, 0.01, "\n".join(notes), fontsize=7, va="bottom")
    fig.tight_layout(rect=(0, 0.03 * len(notes), 1, 1))
    fig.savefig(args.png, dpi=110)
    print("wrote %s" % args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
