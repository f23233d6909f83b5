#!/usr/bin/env python3
"""Lint: no include circle and no call circle among the files of a layer.

For each layer folder given (default: src/coherence src/track), the include
graph of its files (a .c or .h including another of the folder) and the call
graph of its objects (a.o calls a function b.o defines, from `nm`) must have
no cycle: a newcomer can then read the files bottom up. Run by CTest as
lint.cycles with the object folder of the build:

    scripts/check_cycles.py BUILD/CMakeFiles/mapping_objects.dir [layer ...]

Prints each cycle and exits 1 if there is any.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def find_cycle(graph):
    """A cycle of the graph (a list of nodes) or None: depth-first, colours."""
    colour, stack = {}, []

    def visit(n):
        colour[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if colour.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if not colour.get(m):
                found = visit(m)
                if found:
                    return found
        stack.pop()
        colour[n] = 2
        return None

    for n in sorted(graph):
        if not colour.get(n):
            found = visit(n)
            if found:
                return found
    return None


def include_graph(layer):
    folder = os.path.join(ROOT, layer)
    graph = {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith((".c", ".h")):
            continue
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            text = f.read()
        top = os.path.basename(layer)
        deps = set(re.findall(r'#\s*include\s+"%s/([^"]+)"' % re.escape(top), text))
        graph[name] = {d for d in deps if d != name}
    return graph


def symbols(obj, flag):
    out = subprocess.run(["nm", flag, obj], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def call_graph(objdir, layer):
    folder = os.path.join(objdir, layer)
    if not os.path.isdir(folder):
        return None
    objs = sorted(o for o in os.listdir(folder) if o.endswith(".o"))
    defined = {o: symbols(os.path.join(folder, o), "--defined-only") for o in objs}
    owner = {s: o for o, syms in defined.items() for s in syms}
    graph = {}
    for o in objs:
        used = symbols(os.path.join(folder, o), "--undefined-only")
        graph[o] = {owner[s] for s in used if s in owner and owner[s] != o}
    return graph


def main():
    objdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build/CMakeFiles/mapping_objects.dir")
    layers = sys.argv[2:] or ["src/coherence", "src/track"]
    bad = 0
    for layer in layers:
        for kind, graph in (("include", include_graph(layer)), ("call", call_graph(objdir, layer))):
            if graph is None:
                print("cycles: no objects for %s under %s: build first" % (layer, objdir))
                bad = 1
                continue
            cycle = find_cycle(graph)
            if cycle:
                print("cycles: %s circle in %s: %s" % (kind, layer, " -> ".join(cycle)))
                bad = 1
    if not bad:
        print("cycles: ok (no include or call circle in %s)" % ", ".join(layers))
    return bad


if __name__ == "__main__":
    sys.exit(main())
