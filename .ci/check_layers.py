#!/usr/bin/env python3
"""check_layers.py -- the include layering of router/ src/ policies/ bench/ (issue 33).

Includes only go DOWN this order; a folder may include itself; core and net never include each other:

    router -> bench -> serve -> core | net -> proto -> policies -> base

A file's layer: src/<room>/... -> room; policies/... -> policies; bench/... -> bench; router/... ->
router. A quoted include resolves in the including file's folder first, then under src/, then under
the repo root; the build's generated kvr_commit.h and dashboard_html.{h,c} are allowed anywhere.
The core rooms (base, proto, policies, core) never include <uv.h>, <zmq.h>, <curl/multi.h> or
<curl/easy.h>; <curl/curl.h> (URL parsing with curl_url) only in src/proto/url.c and
src/core/config.c. A module is a .c/.h pair by stem within a folder; modules must not include each
other in a cycle. tests/ is not checked. Exit 1 with one line per violation, else 0 and one summary.

Run: python3 .ci/check_layers.py [--root DIR]     (DIR: default the repo this script sits in)
     python3 .ci/check_layers.py --self-test       (synthetic trees in a temp dir; for CTest)
"""
import argparse
import os
import re
import sys
import tempfile

ORDER = [("router",), ("bench",), ("serve",), ("core", "net"), ("proto",), ("policies",), ("base",)]
RANK = {layer: len(ORDER) - i for i, tier in enumerate(ORDER) for layer in tier}  # base 1 .. router 7
ROOMS = ("base", "proto", "core", "net", "serve")
CORE_ROOMS = ("base", "proto", "policies", "core")
FORBIDDEN = ("uv.h", "zmq.h", "curl/multi.h", "curl/easy.h")
CURL_URL_OK = {("proto", "url.c"), ("core", "config.c")}  # (layer, file name) may include <curl/curl.h>
GENERATED = ("kvr_commit.h", "dashboard_html.h", "dashboard_html.c")
TOPS = ("router", "src", "policies", "bench")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')


def layer_of(rel):
    """The layer of a repo-relative path, or None (a file in src/ outside a room)."""
    parts = rel.split("/")
    if parts[0] == "src":
        return parts[1] if len(parts) > 2 and parts[1] in ROOMS else None
    return parts[0] if parts[0] in ("policies", "bench", "router") else None


def c_files(root):
    """Repo-relative paths of the *.c/*.h files under router/ src/ policies/ bench/."""
    out = []
    for top in TOPS:
        for d, subs, names in os.walk(os.path.join(root, top)):
            subs[:] = sorted(s for s in subs if not s.startswith(".") and s != "node_modules")
            out += [os.path.relpath(os.path.join(d, n), root) for n in sorted(names) if n.endswith((".c", ".h"))]
    return [p.replace(os.sep, "/") for p in out]


def includes(root, rel):
    """[(line number, '<' or '"', name)] of a file's #include lines."""
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        return [(n, m.group(1), m.group(2)) for n, line in enumerate(f, 1) if (m := INCLUDE.match(line))]


def resolve(name, rel, known):
    """The repo-relative file a quoted include names (same folder, then src/, then the root), or None."""
    here = os.path.dirname(rel)
    for base in (here, "src", ""):
        cand = os.path.normpath(os.path.join(base, name)).replace(os.sep, "/")
        if cand in known:
            return cand
    return None


def module(rel):
    return os.path.splitext(rel)[0]  # folder/stem: a .c and its .h are one module


def cycles(graph):
    """Each strongly connected component of more than one module (modules that reach each other by
    includes: one or more cycles, reported once), as (its modules, a shortest cycle through the first)."""
    index, low, stack, on, comps = {}, {}, [], set(), []
    for start in sorted(graph):  # iterative Tarjan: no recursion limit on a deep tree
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start), on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w), on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(comp)
    out = []
    for comp in comps:  # breadth-first from the component's first module back to itself
        first = min(comp)
        prev, queue = {first: None}, [first]
        for v in queue:
            nxt = [w for w in sorted(graph[v]) if w in comp]
            if first in nxt:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                out.append((sorted(comp), path[::-1] + [first]))
                break
            for w in nxt:
                if w not in prev:
                    prev[w] = v
                    queue.append(w)
    return sorted(out)


def check(root, layer=layer_of, files=None):
    """Violations as (kind, text) with kind in up|unknown|unresolved|system|cycle, and the counts
    {'files', 'includes'}. layer(rel) maps a path to its layer (code_shape.py passes one that places
    a flat src/ by module name); files defaults to c_files(root)."""
    files = c_files(root) if files is None else files
    known, graph, edge_at, bad, n_inc = set(files), {}, {}, [], 0
    for rel in files:
        src = layer(rel)
        graph.setdefault(module(rel), set())
        if src not in RANK:
            bad.append(("unknown", f"{rel}:1: file is in no layer (src/<room>/ with room in {', '.join(ROOMS)})"))
        for ln, kind, name in includes(root, rel):
            n_inc += 1
            where = f"{rel}:{ln}: include {kind}{name}{'>' if kind == '<' else kind}"
            if kind == "<":
                curl_ok = name == "curl/curl.h" and (src, os.path.basename(rel)) in CURL_URL_OK
                if src in CORE_ROOMS and (name in FORBIDDEN or name == "curl/curl.h" and not curl_ok):
                    bad.append(("system", f"{where} is forbidden in the core room {src} (event loop or transfer API)"))
                continue
            if os.path.basename(name) in GENERATED:
                continue
            dep = resolve(name, rel, known)
            if dep is None:
                bad.append(("unresolved", f"{where} resolves to no file (looked in {os.path.dirname(rel) or '.'}/, src/, the root)"))
                continue
            if module(dep) != module(rel):
                graph[module(rel)].add(module(dep))
                edge_at.setdefault((module(rel), module(dep)), f"{rel}:{ln}")
            dst = layer(dep)
            if src not in RANK or dst not in RANK or src == dst:
                continue
            if RANK[dst] > RANK[src]:
                bad.append(("up", f"{where} goes from {src} up to {dst}"))
            elif RANK[dst] == RANK[src]:
                bad.append(("up", f"{where} goes from {src} across to {dst} (core and net never include each other)"))
    for comp, cyc in cycles(graph):
        among = f" (one of the cycles among {', '.join(comp)})" if len(comp) > len(cyc) - 1 else ""
        bad.append(("cycle", f"{edge_at[(cyc[0], cyc[1])]}: include cycle: {' -> '.join(cyc)}{among}"))
    return bad, {"files": len(files), "includes": n_inc}


def self_test():
    """Tiny trees with known verdicts; prints one line per case and 'N passed, N failed'."""
    clean = {
        "src/base/kvr.h": "#include <stddef.h>\n",
        "src/base/kvr.c": '#include "kvr.h"\n#include "kvr_commit.h"\n',
        "src/proto/url.c": '#include <curl/curl.h>\n#include "base/kvr.h"\n',
        "policies/policy.h": '#include "base/kvr.h"\n',
        "src/core/config.c": '#include <curl/curl.h>\n#include "core/router.h"\n',
        "src/core/router.h": '#include "policies/policy.h"\n#include "proto/url.h"\n',
        "src/proto/url.h": "",
        "src/net/curlm.h": '#include <uv.h>\n#include <curl/multi.h>\n#include "base/kvr.h"\n',
        "src/serve/proxy.c": '#include "core/router.h"\n#include "net/curlm.h"\n',
        "bench/sim/sim.h": '#include "serve/proxy.h"\n',
        "src/serve/proxy.h": "",
        "bench/sim/sim.c": '#include "sim.h"\n#include "bench/sim/sim.h"\n',
        "router/main.c": '#include "bench/sim/sim.h"\n#include "core/router.h"\n',
    }
    cases = [
        ("clean", {}, []),
        ("upward include", {"src/base/log.c": '#include "kvr.h"\n#include "core/router.h"\n'}, ["up"]),
        ("core and net", {"src/core/cache.c": '#include "net/curlm.h"\n'}, ["up"]),
        ("cycle", {"src/core/a.h": '#include "b.h"\n', "src/core/b.c": '#include "b.h"\n',
                   "src/core/b.h": '#include "c.h"\n', "src/core/c.h": '#include "core/a.h"\n'}, ["cycle"]),
        ("<uv.h> in core", {"src/core/timer.c": "#include <uv.h>\n"}, ["system"]),
        ("<curl/curl.h> in proto", {"src/proto/openai.c": "#include <curl/curl.h>\n"}, ["system"]),
        ("unresolvable", {"src/serve/admin.c": '#include "nowhere.h"\n'}, ["unresolved"]),
        ("flat src/", {"src/flat.c": '#include "base/kvr.h"\n'}, ["unknown"]),
    ]
    passed = failed = 0
    for name, extra, want in cases:
        with tempfile.TemporaryDirectory() as root:
            for rel, text in {**clean, **extra}.items():
                os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
                with open(os.path.join(root, rel), "w") as f:
                    f.write(text)
            bad, _ = check(root)
        got = sorted(kind for kind, _ in bad)
        ok = got == want
        passed, failed = passed + ok, failed + (not ok)
        print(f"{'ok' if ok else 'FAIL'}: {name}: want {want}, got {got}" +
              "".join(f"\n    {text}" for _, text in bad if not ok))
    print(f"check_layers self-test: {passed} passed, {failed} failed")
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--self-test", action="store_true", help="check the verdicts on synthetic trees")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    bad, n = check(a.root)
    for _, text in bad:
        print(text)
    print(f"check_layers: {n['files']} files, {n['includes']} includes checked, {len(bad)} violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
