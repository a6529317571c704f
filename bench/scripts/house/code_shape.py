#!/usr/bin/env python3
"""code_shape.py -- the measurable shape of the tree: lines per folder, cycles between the modules of
src/ (by #include and by calls), the longest functions per folder, and clang-format violations.

Cycles by calls come from the object files of a build (--build DIR, default build): module A
depends on B when A.o has an undefined symbol that B.o defines (nm). A cycle is a strongly
connected component of that graph with more than one module; it shows two modules that call each
other even where no header includes the other (e.g. a .c file implementing another module's header).

Functions are found by brace depth with comments, strings and character literals removed: a `{`
at depth 0 whose preceding code ends in `)` opens a function body; its length runs from the line
that holds the function's name (the first line of the declaration) to its closing brace.

Run: python3 bench/scripts/code_shape.py [--root .] [--top 5] [--build build]
"""
import argparse
import glob
import os
import re
import subprocess
import sys

C_EXT = (".c", ".h")


def tracked(root):
    out = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True, check=True)
    return [f for f in out.stdout.split("\n") if f]


def strip_c(text):
    """The text with comments, strings and char literals blanked out (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + re.sub(r"[^\n]", " ", text[i + 1:j]) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    """[(name, first_line, length)] of the function definitions in a C file."""
    text = strip_c(open(path, encoding="utf-8", errors="replace").read())
    lines = text.split("\n")
    res, depth, start, name = [], 0, None, None
    decl_line = 0  # first line of the current top-level declaration
    prev_code = ""
    for ln, line in enumerate(lines, 1):
        starts_decl = line.strip() and not line.startswith((" ", "\t", "#", "}"))
        if depth == 0 and starts_decl and (prev_code == "" or prev_code.endswith((";", "}"))):
            decl_line = ln
        for ch in line:
            if ch == "{":
                if depth == 0 and prev_code.rstrip().endswith(")"):
                    start = decl_line
                    m = re.findall(r"([A-Za-z_]\w*)\s*\(", "\n".join(lines[decl_line - 1:ln]))
                    name = m[0] if m else "?"
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0 and start is not None:
                    res.append((name, start, ln - start + 1))
                    start = None
            if not ch.isspace():
                prev_code = prev_code[-200:] + ch
        if line.strip().startswith("#"):
            prev_code = prev_code + ";"  # a directive ends whatever came before
    return res


def include_cycles(files, folder):
    mods = {}
    for f in files:
        if os.path.dirname(f) == folder and f.endswith(C_EXT):
            m = os.path.splitext(os.path.basename(f))[0]
            for inc in re.findall(r'^#include\s+"([^"]+)"', open(f).read(), re.M):
                dep = os.path.splitext(os.path.basename(inc))[0]
                if dep != m and os.path.exists(os.path.join(folder, os.path.basename(inc))):
                    mods.setdefault(m, set()).add(dep)
            mods.setdefault(m, set())
    return sccs(mods)


def nm_graph(objs):
    """Module -> modules it calls, from the object files' symbol tables."""
    defs, undefs = {}, {}
    for o in objs:
        m = os.path.basename(o).split(".")[0]
        out = subprocess.run(["nm", o], capture_output=True, text=True).stdout
        for line in out.splitlines():
            p = line.split()
            if len(p) == 3 and p[1] in "TDBR":
                defs[p[2]] = m
            elif len(p) == 2 and p[0] == "U":
                undefs.setdefault(m, set()).add(p[1])
    g = {os.path.basename(o).split(".")[0]: set() for o in objs}
    for m, syms in undefs.items():
        g[m] |= {defs[s] for s in syms if s in defs and defs[s] != m}
    return g


def sccs(graph):
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
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

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=".")
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--cycles-in", default="src", help="folder whose module graph is checked")
    ap.add_argument("--build", default="build", help="build folder holding the object files")
    a = ap.parse_args()
    os.chdir(a.root)
    files = tracked(".")
    tops = {}
    for f in files:
        top = f.split("/")[0] if "/" in f else "."
        if f.endswith(C_EXT + (".py", ".sh", ".txt", ".md")) or os.path.basename(f) in ("run",):
            kind = "C" if f.endswith(C_EXT) else os.path.splitext(f)[1].lstrip(".") or "sh"
            n = sum(1 for _ in open(f, errors="replace"))
            tops.setdefault(top, {}).setdefault(kind, 0)
            tops[top][kind] += n
    print("## Lines per top-level folder (git-tracked files)\n")
    print("| folder | C | Python | shell | Markdown | other |")
    print("|---|---:|---:|---:|---:|---:|")
    for top in sorted(tops):
        k = tops[top]
        other = sum(v for kk, v in k.items() if kk not in ("C", "py", "sh", "md"))
        print(f"| {top} | {k.get('C', 0)} | {k.get('py', 0)} | {k.get('sh', 0)} | {k.get('md', 0)} | {other} |")
    cyc = include_cycles(files, a.cycles_in)
    print(f"\nInclude cycles between modules of {a.cycles_in}/: {len(cyc)}" +
          "".join(f"\n- {' <-> '.join(c)}" for c in cyc))
    objs = glob.glob(os.path.join(a.build, "CMakeFiles", "*.dir", a.cycles_in, "*.o"))
    if objs:
        cyc = sccs(nm_graph(objs))
        print(f"Call cycles between modules of {a.cycles_in}/ (nm of {a.build}): {len(cyc)}" +
              "".join(f"\n- {' <-> '.join(c)}" for c in cyc))
    else:
        print(f"Call cycles: no object files of {a.cycles_in}/ under {a.build}/ (build first)")
    print("\n## Longest functions per top-level folder\n")
    print("| folder | functions | median lines | longest (lines, function, file) |")
    print("|---|---:|---:|---|")
    for top in ("router", "src", "policies", "bench", "tests"):
        fs = []
        for f in files:
            if f.startswith(top + "/") and f.endswith(".c"):
                fs += [(n, name, f, ln) for name, ln, n in functions(f)]
        if not fs:
            continue
        fs.sort(reverse=True)
        med = sorted(x[0] for x in fs)[len(fs) // 2]
        longest = "; ".join(f"{n} {name} ({f}:{ln})" for n, name, f, ln in fs[:a.top])
        print(f"| {top} | {len(fs)} | {med} | {longest} |")
    cf = [f for f in files if f.endswith(C_EXT)]
    out = subprocess.run(["clang-format", "--dry-run"] + cf, capture_output=True, text=True)
    warns = [l for l in out.stderr.split("\n") if ": warning:" in l or ": error:" in l]
    bad = {l.split(":")[0] for l in warns}
    print(f"\nclang-format --dry-run: {len(warns)} violations in {len(bad)} of {len(cf)} C files")


if __name__ == "__main__":
    main()
