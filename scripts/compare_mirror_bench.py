#!/usr/bin/env python3
"""Runs two builds' `mapping bench --only mirror,mirror_mark` alternately
(old, new, old, new, ...) on the host back end and prints the medians of the
mirror figures that must not get slower, and new / old.

    scripts/compare_mirror_bench.py OLD/mapping NEW/mapping [rounds]
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


def figures(binary):
    out = subprocess.run([binary, "bench", "--backend", "host", "--only", "mirror,mirror_mark", "--runs", "5", "--json"],
                         capture_output=True, text=True, check=True).stdout
    tables = json.loads(out)["tables"]
    got = {}
    for title, row, col, name in ROWS:
        t = next(t for t in tables if t["title"].startswith(title))
        r = next(r for r in t["rows"] if r[0] == row)
        got[name] = r[t["columns"].index(col)]
    return got


def main():
    old, new = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    runs = {old: [], new: []}
    for _ in range(rounds):
        for b in (old, new):
            runs[b].append(figures(b))
    print("%-40s %12s %12s %9s" % ("figure (median of %d runs each)" % rounds, "old", "new", "new/old"))
    for _, _, _, name in ROWS:
        o = statistics.median(r[name] for r in runs[old])
        n = statistics.median(r[name] for r in runs[new])
        print("%-40s %12.2f %12.2f %9.3f" % (name, o, n, n / o if o else float("nan")))


if __name__ == "__main__":
    main()
