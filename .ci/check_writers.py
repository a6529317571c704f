#!/usr/bin/env python3
"""check_writers.py -- src/core/router*.c is the only writer of router and worker state (issue 33).

The router (kvr_router_t) and its workers (kvr_worker_t) are read everywhere -- the proxy reads a
worker's URL, the views render the counters -- but changed only by src/core/router*.c: every other
module reports what happened through a kvr_router_on_* (or kvr_router_set_*) call and keeps its own
counters. This script finds writes that bypass those calls in router/, bench/, policies/ and the
src/ rooms other than core: an assignment (=, op=, ++, --) whose left side reaches a field through

  - a name declared in the same file as kvr_router_t * or kvr_worker_t * (const or not), or
  - a member named r or router (px->r->x, s->router->x), the house's name for the router pointer,
  - or through the router's worker slots (->slots[i]->x).

It reads code with comments and strings blanked out. A heuristic by names and declarations, not a
compiler: it cannot see a write through a pointer renamed beyond those forms, but every write the
project has had (peer_sync.c's 14 before the relayout) is of these forms. Exit 1 with one line per
write, else 0 and one summary line.

Run: python3 .ci/check_writers.py [--root DIR]   |   python3 .ci/check_writers.py --self-test
"""
import argparse
import os
import re
import sys
import tempfile

SCANNED = ("router", "bench", "policies", "src/base", "src/proto", "src/net", "src/serve")
DECL = re.compile(r"\b(?:const\s+)?kvr_(?:router|worker)_t\s*\*\s*(?:const\s+)?(\w+)")
# The left side of an assignment: a chain of names, ->, ., [index]; then the operator.
ASSIGN = re.compile(r"((?:\w+|\))(?:\s*(?:->|\.)\s*\w+|\s*\[[^\]\n]*\])+)\s*"
                    r"(?:(?:[-+*/%&|^]|<<|>>)?=(?!=)|\+\+|--)")
PRE = re.compile(r"(?:\+\+|--)\s*((?:\w+)(?:\s*(?:->|\.)\s*\w+|\s*\[[^\]\n]*\])+)")


def strip_c(text):
    """Comments, string and character literals blanked (newlines kept, so line numbers hold)."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text[i] in "\"'":
            q, j = text[i], i + 1
            while j < n and text[j] != q and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
        else:
            out.append(text[i])
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:j]))
        i = j
    return "".join(out)


def state_write(lhs, names):
    """True when the left side lhs writes a field of the router or a worker."""
    lhs = re.sub(r"\s+", "", lhs)
    if "->" not in lhs:
        return False
    head = re.match(r"\w+", lhs)
    if head and head.group(0) in names:
        return True
    return bool(re.search(r"->(?:r|router)->", lhs) or re.search(r"->slots\[[^\]]*\]->", lhs))


def check_file(path, rel):
    with open(path, encoding="utf-8", errors="replace") as f:
        code = strip_c(f.read())
    names = set(DECL.findall(code))
    found = []
    for m in list(ASSIGN.finditer(code)) + list(PRE.finditer(code)):
        lhs = m.group(1)
        if lhs.startswith(")"):
            continue
        if state_write(lhs, names):
            line = code.count("\n", 0, m.start()) + 1
            found.append("%s:%d: writes router/worker state '%s' outside src/core/router*.c (report "
                         "it through a kvr_router_on_* call)" % (rel, line, re.sub(r"\s+", "", lhs)))
    return found


def check_tree(root):
    problems, nfiles = [], 0
    for top in SCANNED:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if name.endswith((".c", ".h")):
                    nfiles += 1
                    path = os.path.join(dirpath, name)
                    problems += check_file(path, os.path.relpath(path, root))
    return problems, nfiles


def self_test():
    cases = {
        "clean": ("const kvr_worker_t *w = r->slots[0];\nint x = w->id;\nkvr_router_on_health(r, 1);"
                  "\nif (w->state == 1) x = 2;\n", 0),
        "field": ("kvr_router_t *r = get();\nr->sync_port = 5;\n", 1),
        "counter": ("static void f(kvr_worker_t *w) { w->inflight++; }\n", 1),
        "pre": ("static void f(kvr_worker_t *w) { --w->inflight; }\n", 1),
        "member": ("s->r->peer_sync_live[p] = true;\np->r->peer_instance[q] += 1;\n", 2),
        "slots": ("x->slots[i]->state = 0;\n", 1),
        "comment": ("/* r->x = 1; */\nconst char *s = \"w->y = 2\";\n", 0),
        "compare": ("kvr_router_t *r;\nif (r->x == 1 || r->y != 2 || r->z <= 3) return;\n", 0),
        "own": ("probe_t *p;\np->state = 1;\ns->counters[3]++;\n", 0),
    }
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "src", "serve"))
        for name, (code, want) in cases.items():
            path = os.path.join(tmp, "src", "serve", name + ".c")
            with open(path, "w") as f:
                f.write(code)
            got = len(check_file(path, name))
            if got != want:
                print("self-test %s: %d writes found, want %d" % (name, got, want))
                bad += 1
    print("check_writers self-test: %d of %d cases right" % (len(cases) - bad, len(cases)))
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    problems, nfiles = check_tree(a.root)
    for p in problems:
        print(p)
    print("check_writers: %d files, %d writes of router or worker state outside src/core" %
          (nfiles, len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
