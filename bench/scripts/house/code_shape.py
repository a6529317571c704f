#!/usr/bin/env python3
"""code_shape.py -- the measurable shape of the tree, as issue 33's before/after table (src/ relaid
into rooms by layer): include cycles and include lines against the layer order, what the core
library links, lines per top folder and per src/ room, router/, the README's way to the first
`kvrouter serve` example, what bench/results/ commits, and `duplicates` pairs; then the details:
lines per folder by language, the longest functions, call cycles, clang-format violations.

The layer order and the include resolution are .ci/check_layers.py's (imported, not rewritten):
router -> bench -> serve -> core | net -> proto -> policies -> base. A tree whose src/ is still
flat (src/<stem>.{c,h}) is placed room by room with the issue's map (ROOM_OF below); a stem not in
the map is 'unknown' and the table says which. A cycle is a strongly connected component of the
module graph (a module: a .c/.h pair by stem in one folder), counted once however many cycles it holds.

The core library's link line: the `target_link_libraries` of --core-target (default kvr_core) in
the tree's CMakeLists.txt files, the project's own libraries expanded to what they link, PkgConfig::X
named by its pkg-config module; a build dir's CMakeFiles/<target>.dir/link.txt is read too where it
is a link (a static library's is an `ar` line, which names no library).
Duplicates: `duplicates --repo ROOT --most 1 --seconds 120`, whose first line counts the pairs over
the whole tree (git-tracked and untracked-not-ignored files; its README: source and build files only).

Cycles by calls come from the object files of a build (--build DIR, default ROOT/build): module A
depends on B when A.o has an undefined symbol that B.o defines (nm).

Functions are found by brace depth with comments, strings and character literals removed: a `{`
at depth 0 whose preceding code ends in `)` opens a function body; its length runs from the line
that holds the function's name (the first line of the declaration) to its closing brace.

Run: python3 bench/scripts/house/code_shape.py [--root DIR ...] [--build DIR] [--core-target kvr_core]
         [--table-only] [--json] [--top 3]
     (--root: default the repo this script sits in; several --root give one column each: before/after)
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(REPO, ".ci"))
import check_layers as cl  # noqa: E402  (the layer order and the include resolution)

C_EXT = (".c", ".h")
TOPS = ("router", "src", "policies", "bench", "tests")
ROOMS = ("base", "proto", "core", "net", "serve")
# Issue 33's target rooms, for a tree whose src/ is still flat.
ROOM_OF = {s: room for room, stems in {
    "base": "kvr list buf log metrics quantile cli",
    "proto": "http_headers http_limits http_parse http_request openai prompt kv_decode url vllm",
    "core": "router router_view config cache_index kv_index prefill_clock",
    "net": "http_server http_route curlm kv_sub log_batch",
    "serve": "proxy admin dashboard scrape tokenize kv_feed peers peer_sync discovery reload",
}.items() for s in stems.split()}


def git(root, *args):
    return subprocess.run(["git", "-C", root] + list(args), capture_output=True, text=True, check=True).stdout


def tracked(root):
    return [f for f in git(root, "ls-files").split("\n") if f]


def nlines(path):
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def layer(rel):
    """check_layers' layer, and for a flat src/<stem>.x the room the issue's map gives it."""
    got = cl.layer_of(rel)
    if got is None and rel.startswith("src/") and rel.count("/") == 1:
        return ROOM_OF.get(os.path.splitext(os.path.basename(rel))[0], "unknown")
    return got


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


def layering(root):
    """Include cycles (src/ and elsewhere), include lines against the order, and the rest of
    check_layers' verdicts, with a flat src/ placed by ROOM_OF."""
    files = cl.c_files(root)
    bad, n = cl.check(root, layer=layer, files=files)
    by = {}
    for kind, text in bad:
        by.setdefault(kind, []).append(text)
    cyc = by.get("cycle", [])
    src_cyc = [t for t in cyc if t.split(": include cycle: ")[1].startswith("src/")]
    flat = sorted({os.path.splitext(f)[0][4:] for f in files if f.startswith("src/") and f.count("/") == 1})
    return {
        "src_layout": f"flat ({len(flat)} modules, placed by the issue's map)" if flat else
                      "rooms: " + ", ".join(sorted({f.split("/")[1] for f in files if f.startswith("src/")})),
        "include_cycles_src": len(src_cyc), "include_cycles_other": len(cyc) - len(src_cyc),
        "includes_against_order": len(by.get("up", [])),
        "forbidden_system_includes_core": len(by.get("system", [])),
        "unresolved_includes": len(by.get("unresolved", [])),
        "unknown_stems": sorted(s for s in flat if s not in ROOM_OF),
        "outside_rooms": sorted(t.split(":")[0] for t in by.get("unknown", []) if t.split(":")[0].count("/") > 1),
        "files_checked": n["files"], "includes_checked": n["includes"],
        "_violations": {k: v for k, v in by.items() if k != "unknown"},
    }


def cmake_links(root, files, target):
    """(the libraries target links, expanded through the project's own libraries; the source)."""
    text = ""
    for f in files:
        if os.path.basename(f) == "CMakeLists.txt":
            text += re.sub(r"#[^\n]*", "", open(os.path.join(root, f), errors="replace").read()) + "\n"
    pkg = {m.group(1): m.group(2).split()[-1] for m in
           re.finditer(r"pkg_check_modules\(\s*(\w+)\s+([^)]*)\)", text)}
    links = {}
    for m in re.finditer(r"target_link_libraries\(\s*([\w-]+)([^)]*)\)", text):
        links.setdefault(m.group(1), []).extend(
            w for w in m.group(2).split() if w not in ("PUBLIC", "PRIVATE", "INTERFACE"))
    own = set(re.findall(r"add_library\(\s*([\w-]+)", text))
    if target not in own and target not in links:
        return None, f"no target {target} in CMakeLists.txt"
    out, todo, seen = [], list(links.get(target, [])), set()
    while todo:
        lib = todo.pop(0)
        if lib in seen:
            continue
        seen.add(lib)
        if lib in own and links.get(lib):  # a project library that links others: name it and them
            todo[:0] = links[lib]
        name = pkg.get(lib.split("::")[1], lib) if lib.startswith("PkgConfig::") else lib
        out.append(name + (" (project library)" if lib in own else ""))
    return out, f"target_link_libraries({target} ...) in CMakeLists.txt"


def build_link(build, target):
    """The libraries on a build dir's link.txt for target, or None where it is no link line."""
    for path in glob.glob(os.path.join(build, "**", "CMakeFiles", target + ".dir", "link.txt"), recursive=True):
        words = open(path).read().split()
        if not words or os.path.basename(words[0]) in ("ar", "llvm-ar"):
            return None
        return [os.path.basename(w) for w in words if w.startswith("-l") or re.search(r"\.(so|a)(\.|$)", w)]
    return None


def readme_to_serve(root):
    """(lines, words) of README.md before its first `kvrouter serve` example in a code block."""
    path = os.path.join(root, "README.md")
    if not os.path.exists(path):
        return None, None
    lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
    fence = False
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        elif fence and ("kvrouter serve --worker" in line or "kvrouter serve " in line):
            return i, len(" ".join(lines[:i]).split())
    return None, None


def duplicates(root):
    cmd = ["duplicates", "--repo", root, "--most", "1", "--seconds", "120"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"pairs": None, "note": f"duplicates did not run: {e}"}
    first = out.split("\n")[0]
    m = re.match(r"(\d+) pairs?\b", first)
    files = re.search(r"(\d+) files? read", first)
    incomplete = [l for l in out.split("\n") if l.startswith("incomplete:")]
    return {"pairs": int(m.group(1)) if m else (0 if first.startswith("no duplicates") else None),
            "files_read": int(files.group(1)) if files else None, "incomplete": incomplete}


def measure(root, build, core_target):
    files = tracked(root)
    r = {"tree": os.path.abspath(root), "commit": git(root, "describe", "--always", "--dirty").strip()}
    r.update(layering(root))
    libs, source = cmake_links(root, files, core_target)
    r["core_target"], r["core_links"], r["core_links_from"] = core_target, libs, source
    r["core_link_txt"] = build_link(build, core_target)
    names = " ".join(libs or []) + " " + " ".join(r["core_link_txt"] or [])
    r["core_links_uv_curl_zmq"] = {k: k in names for k in ("libuv", "libcurl", "libzmq")}
    c_files = [f for f in files if f.endswith(C_EXT)]
    size = {f: nlines(os.path.join(root, f)) for f in c_files if os.path.exists(os.path.join(root, f))}
    r["c_lines_top"] = {t: sum(n for f, n in size.items() if f.startswith(t + "/")) for t in TOPS}
    rooms = {}
    for f, n in size.items():
        if f.startswith("src/"):
            room = layer(f) if layer(f) in ROOMS else "unknown"
            rooms[room] = rooms.get(room, 0) + n
    r["c_lines_room"] = {k: rooms.get(k, 0) for k in ROOMS + ("unknown",)}
    rt = {f: nlines(os.path.join(root, f)) for f in files if f.startswith("router/")}
    r["router_lines"], r["router_files"] = sum(rt.values()), len(rt)
    r["router_longest"] = max(rt.items(), key=lambda x: x[1]) if rt else None
    r["readme_lines_to_serve"], r["readme_words_to_serve"] = readme_to_serve(root)
    res = [f for f in files if f.startswith("bench/results/")]
    r["results_files"] = len(res)
    r["results_bytes"] = sum(os.path.getsize(os.path.join(root, f)) for f in res if os.path.exists(os.path.join(root, f)))
    r["duplicates"] = duplicates(root)
    return r


def rows(r):
    """(measure, value) rows of the before/after table."""
    yes = lambda b: "yes" if b else "no"
    links = r["core_links_uv_curl_zmq"]
    rt = r["router_longest"]
    d = r["duplicates"]
    out = [
        ("src/ layout", r["src_layout"]),
        ("include cycles in src/ (strongly connected module groups)", r["include_cycles_src"]),
        ("include cycles elsewhere (router/ policies/ bench/)", r["include_cycles_other"]),
        ("include lines against the layer order", r["includes_against_order"]),
        ("system includes forbidden in the core rooms (<uv.h>, <zmq.h>, curl transfer API)", r["forbidden_system_includes_core"]),
        ("unresolvable quoted includes", r["unresolved_includes"]),
        ("src/ files in no room ('unknown': a flat stem not in the map, or no room's folder)",
         ", ".join(r["unknown_stems"] + r["outside_rooms"]) or "none"),
        (f"core library {r['core_target']} links", ", ".join(r["core_links"]) if r["core_links"] is not None
         else r["core_links_from"]),
        ("core links libuv / libcurl / libzmq", " / ".join(yes(links[k]) for k in ("libuv", "libcurl", "libzmq"))),
    ]
    out += [(f"C lines in {t}/", r["c_lines_top"][t]) for t in TOPS]
    out += [(f"C lines in src/ room {k}", v) for k, v in r["c_lines_room"].items() if k != "unknown" or v]
    out += [
        ("router/ lines (files)", f"{r['router_lines']} ({r['router_files']})"),
        ("router/ longest file", f"{rt[0]} ({rt[1]} lines)" if rt else "-"),
        ("README.md lines before the first `kvrouter serve` example", r["readme_lines_to_serve"]),
        ("README.md words before it", r["readme_words_to_serve"]),
        ("bench/results/ committed files", r["results_files"]),
        ("bench/results/ committed bytes", f"{r['results_bytes']:,}"),
        ("`duplicates` pairs over the tree (files read)",
         f"{d['pairs']} ({d.get('files_read')} files read)" + ("; " + "; ".join(d["incomplete"]) if d.get("incomplete") else "")
         if d["pairs"] is not None else d.get("note", "?")),
    ]
    return out


def details(root, build, top, cycles_in="src"):
    """The older sections: lines per folder by language, longest functions, call cycles, clang-format."""
    files = tracked(root)
    tops = {}
    for f in files:
        t = f.split("/")[0] if "/" in f else "."
        if f.endswith(C_EXT + (".py", ".sh", ".txt", ".md")) or os.path.basename(f) in ("run",):
            kind = "C" if f.endswith(C_EXT) else os.path.splitext(f)[1].lstrip(".") or "sh"
            tops.setdefault(t, {}).setdefault(kind, 0)
            tops[t][kind] += nlines(os.path.join(root, f))
    print("\n## Lines per top-level folder (git-tracked files)\n")
    print("| folder | C | Python | shell | Markdown | other |")
    print("|---|---:|---:|---:|---:|---:|")
    for t in sorted(tops):
        k = tops[t]
        other = sum(v for kk, v in k.items() if kk not in ("C", "py", "sh", "md"))
        print(f"| {t} | {k.get('C', 0)} | {k.get('py', 0)} | {k.get('sh', 0)} | {k.get('md', 0)} | {other} |")
    objs = glob.glob(os.path.join(build, "CMakeFiles", "*.dir", cycles_in, "**", "*.o"), recursive=True)
    if objs:
        cyc = cl.cycles(nm_graph(objs))
        print(f"\nCall cycles between modules of {cycles_in}/ (nm of {build}): {len(cyc)}" +
              "".join(f"\n- {' <-> '.join(comp)}" for comp, _ in cyc))
    else:
        print(f"\nCall cycles: no object files of {cycles_in}/ under {build}/ (build first)")
    print("\n## Longest functions per top-level folder\n")
    print("| folder | functions | median lines | longest (lines, function, file) |")
    print("|---|---:|---:|---|")
    for t in TOPS:
        fs = []
        for f in files:
            if f.startswith(t + "/") and f.endswith(".c"):
                fs += [(n, name, f, ln) for name, ln, n in functions(os.path.join(root, f))]
        if not fs:
            continue
        fs.sort(reverse=True)
        med = sorted(x[0] for x in fs)[len(fs) // 2]
        longest = "; ".join(f"{n} {name} ({f}:{ln})" for n, name, f, ln in fs[:top])
        print(f"| {t} | {len(fs)} | {med} | {longest} |")
    cf = [f for f in files if f.endswith(C_EXT)]
    out = subprocess.run(["clang-format", "--dry-run"] + cf, capture_output=True, text=True, cwd=root)
    warns = [l for l in out.stderr.split("\n") if ": warning:" in l or ": error:" in l]
    bad = {l.split(":")[0] for l in warns}
    print(f"\nclang-format --dry-run: {len(warns)} violations in {len(bad)} of {len(cf)} C files")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", action="append", help="a tree to measure (repeat for before/after columns)")
    ap.add_argument("--build", help="build dir holding the object files and link.txt (default ROOT/build)")
    ap.add_argument("--core-target", default="kvr_core", help="the CMake target of the core library")
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--table-only", action="store_true", help="no details after the table")
    ap.add_argument("--json", action="store_true", help="the table's figures as JSON")
    a = ap.parse_args()
    roots = a.root or [REPO]
    builds = {root: a.build or os.path.join(root, "build") for root in roots}
    res = [measure(root, builds[root], a.core_target) for root in roots]
    if a.json:
        print(json.dumps([{k: v for k, v in r.items() if not k.startswith("_")} for r in res], indent=1))
        return
    print("## Issue 33: the shape of the tree\n")
    print("| measure | " + " | ".join(f"{r['commit']} ({r['tree']})" for r in res) + " |")
    print("|---|" + "---:|" * len(res))
    table = [rows(r) for r in res]
    for i, (name, _) in enumerate(table[0]):
        print(f"| {name} | " + " | ".join(str(t[i][1]) for t in table) + " |")
    for r in res:
        print(f"\n{r['commit']}: {r['files_checked']} files and {r['includes_checked']} includes checked "
              f"(.ci/check_layers.py's resolution); core link line from {r['core_links_from']}"
              + (f", and {builds[r['tree']]}'s link.txt: {' '.join(r['core_link_txt'])}" if r["core_link_txt"] else
                 f"; {r['core_target']}'s link.txt in the build dir is none or an `ar` line (a static library)"))
        for kind in ("cycle", "up", "system", "unresolved"):
            for text in r["_violations"].get(kind, []):
                print(f"- {text}")
    if not a.table_only:
        for root in roots:
            print(f"\n# Details: {root}")
            details(root, builds[root], a.top)


if __name__ == "__main__":
    main()
