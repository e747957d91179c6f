#!/usr/bin/env python3
"""Prints the product-code budgets of crates/ and the services' skeleton rules, and whether
each holds (issue 28: one controller shape).

Product code: `crates/*/src/**/*.rs` without test-only files (`*_tests.rs`, `tests.rs`,
`testing.rs`, `test_*.rs`) and without `#[cfg(test)]` items. Exit status 1 when a budget
or a rule is missed (`--check`), or a rule, the comment ratio, the file size or the import
cycles (`--check-shape`, what CI enforces; no repeated-code scan); else 0.
"""
import os
import re
import subprocess
import sys
from collections import defaultdict

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
MAX_CODE, MAX_COMMENT_RATIO, MAX_FILE, MAX_DUP_PAIRS = 8000, 0.25, 600, 15
SERVICES = ("provision-svc", "pv-writer", "reclaim-svc")
SKELETON = ("config", "controller", "operation", "decision", "metrics", "api_calls")
MAX_MAIN, MAX_LIB, MAX_OPERATION_FN, MAX_MODULE_DOC, MAX_ITEM_DOC = 20, 40, 80, 15, 3
FN = re.compile(r"\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)")
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


RAW_STRING = re.compile(r'b?r(#*)"')
CHAR = re.compile(r"b?'(\\(x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'\n])'")


def mask(text):
    """`text` with comments blanked and string and char literals filled with `_` (newlines
    kept), so braces, `fn` and `spawn(` are only ever matched in code."""
    out, i, n = [], 0, len(text)
    fill = lambda part, ch: "".join("\n" if c == "\n" else ch for c in part)
    while i < n:
        j, ch = i + 1, None
        ident_before = i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")
        if text.startswith("//", i):
            j = text.find("\n", i)
            j, ch = (n if j < 0 else j), " "
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                step = text[j:j + 2]
                depth += (step == "/*") - (step == "*/")
                j += 2 if step in ("/*", "*/") else 1
            ch = " "
        elif not ident_before and (m := RAW_STRING.match(text, i)):
            end = text.find('"' + m.group(1), m.end())
            j, ch = (n if end < 0 else end + 1 + len(m.group(1))), "_"
        elif text[i] == '"' or (text[i] == "b" and not ident_before and text.startswith('b"', i)):
            j = text.index('"', i) + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j, ch = min(j + 1, n), "_"
        elif not ident_before and (m := CHAR.match(text, i)):
            j, ch = m.end(), "_"
        out.append(text[i:j] if ch is None else fill(text[i:j], ch))
        i = j
    return "".join(out)


def item_end(masked, start):
    """(last line index, has a body) of the item starting at `masked[start]`: through its
    closing brace, or its `;` before any brace; `None` when it never ends."""
    depth, opened = 0, False
    for j in range(start, len(masked)):
        code = masked[j]
        depth += code.count("{") - code.count("}")
        opened = opened or "{" in code
        if (opened and depth <= 0) or (not opened and code.rstrip().endswith(";")):
            return j, opened
    return None


def strip_test_items(lines, masked):
    """`lines` and `masked` without each `#[cfg(test)]` item (attribute through its closing
    brace or semicolon, matched in `masked`)."""
    kept, kept_masked, i = [], [], 0
    while i < len(lines):
        if masked[i].strip().startswith("#[cfg(test)]"):
            end = item_end(masked, i)
            i = (end[0] if end else len(lines) - 1) + 1
            continue
        kept.append(lines[i])
        kept_masked.append(masked[i])
        i += 1
    return kept, kept_masked


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


def functions(lines):
    """(name, first line index, length in lines) of each `fn` with a body in `lines` (masked)."""
    out = []
    for i, line in enumerate(lines):
        m = FN.match(line)
        end = item_end(lines, i) if m else None
        if end and end[1]:
            out.append((m.group(6), i, end[0] - i + 1))
    return out


def doc_runs(lines):
    """Length of the module doc (`//!` at the top) and (line index, length) of each `///` run."""
    module = 0
    for line in lines:
        if line.strip().startswith("//!"):
            module += 1
        elif line.strip():
            break
    runs, start = [], None
    for i, line in enumerate(lines + [""]):
        if line.strip().startswith("///"):
            start = i if start is None else start
        elif start is not None:
            runs.append((start, i - start))
            start = None
    return module, runs


def skeleton(files, masked):
    """The skeleton rules of issue 28, as (rule, list of what breaks it)."""
    rel = lambda p: os.path.relpath(p, ROOT)
    def lines_of(path):
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    modules, sizes, spawns, controllers = [], [], [], []
    for svc in SERVICES:
        src = os.path.join(ROOT, "crates", svc, "src")
        modules += [f"{svc}: no {m}.rs" for m in SKELETON if not os.path.exists(os.path.join(src, m + ".rs"))]
        for name, limit in (("main.rs", MAX_MAIN), ("lib.rs", MAX_LIB)):
            n = len(lines_of(os.path.join(src, name)))
            if n > limit:
                sizes.append(f"crates/{svc}/src/{name}: {n} lines (at most {limit})")
        for path, code in masked.items():
            if path.startswith(src + os.sep) and os.path.basename(path) != "controller.rs":
                spawns += [f"{rel(path)}:{i + 1}" for i, l in enumerate(code)
                           if re.search(r"\bspawn(_blocking|_local)?\(", l)]
        if svc != "pv-writer":
            ctrl = "\n".join(files.get(os.path.join(src, "controller.rs"), []))
            if "control::run(" not in ctrl and "Controller::" not in ctrl:
                controllers.append(f"{svc}: controller.rs does not run kube-runtime's Controller")
    long_ops, docs = [], []
    for path, lines in files.items():
        if os.path.basename(path) == "operation.rs":
            long_ops += [f"{rel(path)}:{i + 1} {name} ({n} lines)" for name, i, n in functions(masked[path])
                         if n > MAX_OPERATION_FN]
        module, runs = doc_runs(lines)
        if module > MAX_MODULE_DOC:
            docs.append(f"{rel(path)}: module doc of {module} lines")
        docs += [f"{rel(path)}:{i + 1}: item doc of {n} lines" for i, n in runs if n > MAX_ITEM_DOC]
    return [
        ("services' modules: " + " ".join(SKELETON), modules),
        (f"main.rs <= {MAX_MAIN}, lib.rs <= {MAX_LIB} lines", sizes),
        ("spawns only in a service's controller.rs", spawns),
        ("claims and PVs on kube-runtime's Controller", controllers),
        (f"operation functions <= {MAX_OPERATION_FN} lines", long_ops),
        (f"module docs <= {MAX_MODULE_DOC}, item docs <= {MAX_ITEM_DOC} lines", docs),
    ]


def main():
    files, masked = {}, {}
    for path in product_files():
        with open(path, encoding="utf-8") as f:
            text = f.read()
            files[path], masked[path] = strip_test_items(text.splitlines(), mask(text).splitlines())
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
    scanned = "--check-shape" not in sys.argv
    pairs = duplicate_pairs() if scanned else None
    dups, boilerplate = pairs if pairs else (None, 0)
    print(f"{'crate':<22}{'code':>7}{'comments':>10}")
    for crate, (code, comments) in sorted(per_crate.items()):
        print(f"{crate:<22}{code:>7}{comments:>10}")
    rows = [
        ("product code lines", total_code, f"<= {MAX_CODE}", total_code <= MAX_CODE),
        ("comments / code", f"{ratio:.3f}", f"<= {MAX_COMMENT_RATIO}", ratio <= MAX_COMMENT_RATIO),
        (f"files over {MAX_FILE} lines", len(big), "0", not big),
        ("module import cycles", len(cycles), "0", not cycles),
        ("repeated-code pairs in crates/", "n/a" if dups is None else dups, f"<= {MAX_DUP_PAIRS}",
         dups is None or dups <= MAX_DUP_PAIRS),
    ]
    print()
    for name, value, budget, ok in rows:
        shown = "not counted" if value == "n/a" else "met" if ok else "MISSED"
        print(f"{name:<32}{str(value):>8}  budget {budget:<8} {shown}")
    for line in big + cycles:
        print(f"  {line}")
    if not scanned:
        print("  (repeated code not scanned with --check-shape)")
    elif dups is None:
        print("  (the `duplicates` command is not on this machine: pairs not counted)")
    else:
        print(f"  repeated-code pairs: {dups - boilerplate} of logic, {boilerplate} the tool marks "
              "boilerplate (same shape only: flag blocks, struct literals, trait delegation)")
    rules = skeleton(files, masked)
    print()
    for rule, broken in rules:
        print(f"{rule:<76}{'met' if not broken else f'MISSED ({len(broken)})'}")
        for what in broken:
            print(f"  {what}")
    longest = sorted(((n, os.path.relpath(p, ROOT), name) for p, lines in files.items()
                      for name, _, n in functions(masked[p])), reverse=True)[:5]
    print("\nlongest functions: " + ", ".join(f"{p} {name} ({n})" for n, p, name in longest))
    missed = not all(ok for *_, ok in rows) or any(broken for _, broken in rules)
    shape_missed = not all(ok for *_, ok in rows[1:4]) or any(broken for _, broken in rules)
    if ("--check" in sys.argv and missed) or ("--check-shape" in sys.argv and shape_missed):
        sys.exit(1)


if __name__ == "__main__":
    main()
