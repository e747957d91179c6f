#!/usr/bin/env python3
"""Prints the product-code budgets of crates/ and whether each holds.

Product code: `crates/*/src/**/*.rs` without test-only files (`*_tests.rs`, `tests.rs`,
`testing.rs`, `test_*.rs`) and without `#[cfg(test)]` items. Exit status 1 when a budget
is exceeded (`--check`), else 0.
"""
import os
import re
import subprocess
import sys
from collections import defaultdict

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
MAX_CODE, MAX_COMMENT_RATIO, MAX_FILE, MAX_DUP_PAIRS = 8000, 0.25, 600, 15
TEST_FILE = re.compile(r"(_tests|^tests|^testing|^test_\w+)\.rs$")


def product_files():
    out = []
    for crate in sorted(os.listdir(os.path.join(ROOT, "crates"))):
        src = os.path.join(ROOT, "crates", crate, "src")
        for dirpath, _, names in os.walk(src):
            for name in sorted(names):
                if name.endswith(".rs") and not TEST_FILE.search(name):
                    out.append(os.path.join(dirpath, name))
    return sorted(out)


def strip_test_items(lines):
    """Drops each `#[cfg(test)]` item (attribute through its closing brace or semicolon)."""
    kept, i = [], 0
    while i < len(lines):
        if lines[i].strip().startswith("#[cfg(test)]"):
            depth, opened = 0, False
            while i < len(lines):
                code = re.sub(r'"(\\.|[^"\\])*"', '""', lines[i].split("//")[0])
                depth += code.count("{") - code.count("}")
                opened = opened or "{" in code
                i += 1
                if (opened and depth <= 0) or (not opened and code.rstrip().endswith(";")):
                    break
            continue
        kept.append(lines[i])
        i += 1
    return kept


def count(lines):
    code = comments = 0
    in_block = False
    for line in lines:
        s = line.strip()
        if in_block:
            comments += 1
            in_block = "*/" not in s
        elif not s:
            continue
        elif s.startswith("//"):
            comments += 1
        elif s.startswith("/*"):
            comments += 1
            in_block = "*/" not in s
        else:
            code += 1
    return code, comments


def module_of(crate_src, path):
    rel = os.path.relpath(path, crate_src)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def import_cycles(files):
    """Cycles between the top-level modules of each crate (`use crate::a` inside `b`)."""
    graphs = defaultdict(lambda: defaultdict(set))
    for path, lines in files.items():
        crate_src = path.split("/src/")[0] + "/src"
        mod = module_of(crate_src, path)
        if not mod:
            continue
        for line in lines:
            for target in re.findall(r"\bcrate::(\w+)", line):
                if target != mod[0]:
                    graphs[crate_src][mod[0]].add(target)
    cycles = []
    for crate_src, graph in graphs.items():
        crate = os.path.basename(os.path.dirname(crate_src))
        for a in graph:
            for b in graph[a]:
                if a < b and a in reachable(graph, b):
                    cycles.append(f"{crate}: {a} <-> {b}")
    return cycles


def reachable(graph, start):
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        for nxt in graph.get(node, ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def duplicate_pairs():
    try:
        out = subprocess.run(["duplicates", "--repo", os.path.join(ROOT, "crates"), "--most", "200",
                              "--seconds", "120"], capture_output=True, text=True, timeout=300).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"(\d+) pairs?", out)
    b = re.search(r"(\d+) of those marked boilerplate", out)
    if not m:
        return (0, 0) if "no duplicates" in out else None
    return int(m.group(1)), int(b.group(1)) if b else 0


def main():
    files = {}
    for path in product_files():
        with open(path, encoding="utf-8") as f:
            files[path] = strip_test_items(f.read().splitlines())
    total_code = total_comments = 0
    per_crate = defaultdict(lambda: [0, 0])
    big = []
    for path, lines in files.items():
        code, comments = count(lines)
        total_code += code
        total_comments += comments
        crate = os.path.relpath(path, ROOT).split(os.sep)[1]
        per_crate[crate][0] += code
        per_crate[crate][1] += comments
        if len(lines) > MAX_FILE:
            big.append(f"{os.path.relpath(path, ROOT)} ({len(lines)} lines)")
    ratio = total_comments / max(total_code, 1)
    cycles = import_cycles(files)
    pairs = duplicate_pairs()
    dups, boilerplate = pairs if pairs else (None, 0)
    print(f"{'crate':<22}{'code':>7}{'comments':>10}")
    for crate, (code, comments) in sorted(per_crate.items()):
        print(f"{crate:<22}{code:>7}{comments:>10}")
    rows = [
        ("product code lines", total_code, f"<= {MAX_CODE}", total_code <= MAX_CODE),
        ("comments / code", f"{ratio:.2f}", f"<= {MAX_COMMENT_RATIO}", ratio <= MAX_COMMENT_RATIO),
        (f"files over {MAX_FILE} lines", len(big), "0", not big),
        ("module import cycles", len(cycles), "0", not cycles),
        ("repeated-code pairs in crates/", "n/a" if dups is None else dups, f"<= {MAX_DUP_PAIRS}",
         dups is None or dups <= MAX_DUP_PAIRS),
    ]
    print()
    for name, value, budget, ok in rows:
        print(f"{name:<32}{str(value):>8}  budget {budget:<8} {'met' if ok else 'MISSED'}")
    for line in big + cycles:
        print(f"  {line}")
    if dups is None:
        print("  (the `duplicates` command is not on this machine: pairs not counted)")
    else:
        print(f"  repeated-code pairs: {dups - boilerplate} of logic, {boilerplate} the tool marks "
              "boilerplate (same shape only: flag blocks, struct literals, trait delegation)")
    if "--check" in sys.argv and not all(ok for *_, ok in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
