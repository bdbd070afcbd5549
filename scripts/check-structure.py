#!/usr/bin/env python3
"""The structure rules of docs/architecture.md, checked on a build.

1. No call circle between source files: file A calls a function defined
   in file B (read from the objects' symbol tables with nm) makes an edge
   A -> B; a strongly connected set of two or more files is a circle.
   Checked per folder group (the connector with the dialects, the engine
   with its lanes, the bootstrap JSON code) and across the whole library.
2. No dialect knowledge outside src/dialect/: the patterns below (dialect
   constants, frame layouts, wire JSON keys) appear only there.

Usage: check-structure.py BUILD_DIR [--report] [--allow-circle PREFIX]...
  --report: print, never fail; --allow-circle: a circle all of whose files
  start with PREFIX is printed but does not fail (a restructure under way)
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def objects(build):
    base = os.path.join(build, "CMakeFiles", "kvb_objs.dir", "src")
    out = {}
    for d, _, files in os.walk(base):
        for f in files:
            if f.endswith(".c.o"):
                p = os.path.join(d, f)
                rel = os.path.relpath(p, base)[:-2]  # "conn/decode.c"
                if os.path.exists(os.path.join(ROOT, "src", rel)):  # not a moved file's stale object
                    out[rel] = p
    return out


def symbols(path):
    res = subprocess.run(["nm", "-g", path], capture_output=True, text=True, check=True)
    defined, undefined = set(), set()
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            undefined.add(parts[1])
        elif len(parts) == 3 and parts[1] in "TDBRVWC":
            defined.add(parts[2])
    return defined, undefined


def graph(objs):
    owner, uses = {}, {}
    for name, path in objs.items():
        d, u = symbols(path)
        for s in d:
            owner[s] = name
        uses[name] = u
    edges = {n: set() for n in objs}
    for n, u in uses.items():
        for s in u:
            o = owner.get(s)
            if o is not None and o != n:
                edges[n].add(o)
    return edges


def sccs(edges):
    """Tarjan's algorithm, iterative; the components of two or more files."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def circles(edges):
    bad = []
    for comp in sccs(edges):
        members = set(comp)
        back = sorted(f"{a} -> {b}" for a in comp for b in edges[a] if b in members)
        bad.append((comp, back))
    return bad


# Dialect knowledge: names that belong to one dialect's module. A pattern
# found in a file outside src/dialect/ is a violation.
DIALECT_PATTERNS = [
    r"KVB__DIALECT_",  # the old dialect constants
    r"KVB__TS_",  # TokenSpeed's values and kinds
    r"KVB__MSG_",  # SGLang's message kinds
    r"KVB__WIRE_",  # SGLang's status values
    r"KVB__KIND_",  # message kind names
    r"\bKVB__(REG|XFER|STATUS)(26|TS)_",  # frame counts
    r"kvb__frames_(en|de)code_(?!peer)",  # a dialect's message codec
    r"kvb__frames_classify",
    r"kvb__lol_",  # SGLang 2026's list-of-lists
    r"\bKVB__CPD_",  # TokenSpeed 0.1.1 CachePD's values, limits and frame counts
    r"kvb__cpd_",  # CachePD's codec and planner
]
# Not listed: kvbridge's own extension framing ("kvbridge-ext/1" and its
# key=value frames, proto/frames.h), which rides on several dialects; the
# bootstrap route table (proto/bootstrap_json.c, bootstrap/client.c) still
# calls each dialect's JSON shapes by name (docs/architecture.md).
DIALECT_HOME = "src/dialect/"


def dialect_leaks():
    res = subprocess.run(["git", "-C", ROOT, "ls-files", "src"], capture_output=True,
                         text=True, check=True)
    out = []
    rx = re.compile("|".join(DIALECT_PATTERNS))
    for f in res.stdout.split():
        if f.startswith(DIALECT_HOME) or not f.endswith((".c", ".h")):
            continue
        with open(os.path.join(ROOT, f), encoding="utf-8") as fh:
            for i, line in enumerate(fh, 1):
                if rx.search(line):
                    out.append(f"{f}:{i}: {line.strip()}")
    return out


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    report = "--report" in sys.argv
    allowed = [sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a == "--allow-circle"]
    objs = objects(sys.argv[1])
    if not objs:
        print("check-structure: no objects under", sys.argv[1])
        return 2
    bad = circles(graph(objs))
    tolerated = [c for c in bad if any(all(f.startswith(p) for f in c[0]) for p in allowed)]
    for comp, back in bad:
        print("circle (allowed for now):" if (comp, back) in tolerated else "circle:", " ".join(comp))
        for e in back:
            print("   ", e)
    leaks = dialect_leaks()
    for l in leaks:
        print("dialect knowledge outside", DIALECT_HOME + ":", l)
    print(f"check-structure: {len(objs)} files, {len(bad)} circle(s), "
          f"{len(leaks)} dialect leak(s)")
    failing = len(bad) - len(tolerated)
    return 0 if report or (not failing and not leaks) else 1


if __name__ == "__main__":
    sys.exit(main())
