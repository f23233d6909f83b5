#!/usr/bin/env python3
"""Runs two builds' `mapping bench --only mirror,mirror_mark` alternately
(old, new, old, new, ...) on the host back end and prints the medians of the
mirror figures that must not get slower, and new / old.

    scripts/compare_mirror_bench.py [--tracking] OLD/mapping NEW/mapping [rounds]

--tracking adds the section `tracking` (a tracked 1 GiB mirror with the link
model: 1 written byte + sync, 1,000 scattered writes + sync, clean sync),
measured with the write-tracking mechanism $MAPPING_TRACK picks.
"""
import json
import statistics
import subprocess
import sys

ROWS = [  # (table title start, row label, column, name)
    ("Mirror of 1 GiB", "sync, clean mirror", "median ns", "clean sync of 1 GiB, ns"),
    ("Mirror of 1 GiB", "mark 1 B + sync", "median ns", "mark 1 byte + sync, ns"),
    ("The same 1,000 edits", "host", "marks+sync us", "1,000 marks + sync, us"),
    ("1,000 scattered 64-byte", "host", "mirror us", "1,000 scattered ranges: sync, us"),
    ("Marking n ranges", "1000", "mark+sync ns", "1e3 random marks + sync, ns/mark"),
    ("Marking n ranges", "1000000", "mark+sync ns", "1e6 random marks + sync, ns/mark"),
]
TRACKING_ROWS = [
    ("tracked (no marks)", "1 byte in 1 GiB", "tracked us", "tracked: 1 byte + sync, us"),
    ("tracked (no marks)", "1,000 x 64 B in 256 MiB", "tracked us", "tracked: 1,000 x 64 B + sync, us"),
    ("tracked (no marks)", "clean sync, 1 GiB", "tracked us", "tracked: clean sync, us"),
]


def figures(binary, rows):
    only = "mirror,mirror_mark" + (",tracking" if rows is not ROWS else "")
    out = subprocess.run([binary, "bench", "--backend", "host", "--only", only, "--runs", "5", "--json"],
                         capture_output=True, text=True, check=True).stdout
    tables = json.loads(out)["tables"]
    got = {}
    for title, row, col, name in rows:
        t = next(t for t in tables if t["title"].startswith(title))
        r = next(r for r in t["rows"] if r[0] == row)
        got[name] = r[t["columns"].index(col)]
    return got


def main():
    args = sys.argv[1:]
    rows = ROWS
    if args and args[0] == "--tracking":
        rows = ROWS + TRACKING_ROWS
        args = args[1:]
    old, new = args[0], args[1]
    rounds = int(args[2]) if len(args) > 2 else 5
    runs = {old: [], new: []}
    for _ in range(rounds):
        for b in (old, new):
            runs[b].append(figures(b, rows))
    print("%-40s %12s %12s %9s" % ("figure (median of %d runs each)" % rounds, "old", "new", "new/old"))
    for _, _, _, name in rows:
        o = statistics.median(r[name] for r in runs[old])
        n = statistics.median(r[name] for r in runs[new])
        print("%-40s %12.2f %12.2f %9.3f" % (name, o, n, n / o if o else float("nan")))


if __name__ == "__main__":
    main()
