#!/usr/bin/env python3
"""level_json.py -- a bench level's JSON as experiments keep it in git: without per-request arrays.

Shared (bench/scripts/lib/): no experiment of its own; writes only the files it is given.

`kvrouter bench` writes one JSON per level (bench/report/report_json.c): the aggregates, and the
per-request arrays of request_arrays(), at the top level (vLLM's names, PER_REQUEST_TOP) and in
its "kvrouter" object (PER_REQUEST_KVROUTER). The reports read the aggregates only, so a kept level
drops the arrays; a script that reads some of them names those in keep (calibrate.py's closed-loop
columns).

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
    from level_json import find, slim_file, slim_level, write_level
    level = slim_level(json.load(f))      # a new dict; the one given is left as it was
    fleet = find(level, "model_fleet")    # the first value of a key anywhere in the tree
    slim_file(path)                       # the file at path rewritten without its arrays

write_level writes compact JSON and a newline, the form every kept level has. Shell use (ab.sh):
`python3 bench/scripts/lib/level_json.py slim DEST SRC...` writes each SRC, slimmed, to
DEST/basename(SRC). The standard library only.
"""
import argparse
import json
import os

PER_REQUEST_TOP = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times",
                   "queue_times", "generated_texts", "errors")
PER_REQUEST_KVROUTER = ("cached_lens", "e2els", "tpots", "turns")


def find(obj, key):
    """The first value of key anywhere in a JSON tree, or None."""
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        obj = list(obj.values())
    if isinstance(obj, list):
        for v in obj:
            got = find(v, key)
            if got is not None:
                return got
    return None


def slim_level(d, keep=()):
    """The per-level JSON d (a dict) without its per-request arrays but for the names in keep
    (top-level or kvrouter ones); the other keys in their order. d itself is not changed."""
    d = {k: v for k, v in d.items() if k not in PER_REQUEST_TOP or k in keep}
    if isinstance(d.get("kvrouter"), dict):
        d["kvrouter"] = {k: v for k, v in d["kvrouter"].items()
                         if k not in PER_REQUEST_KVROUTER or k in keep}
    return d


def write_level(path, d):
    """Writes d to path as compact JSON and a newline."""
    with open(path, "w") as f:
        json.dump(d, f, separators=(",", ":"))
        f.write("\n")


def slim_file(path, dest=None):
    """Reads the per-level JSON at path and writes it without its per-request arrays to dest
    (default: path itself)."""
    with open(path) as f:
        d = json.load(f)
    write_level(dest or path, slim_level(d))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("slim", help="write each SRC without its arrays to DEST/basename(SRC)")
    s.add_argument("dest")
    s.add_argument("src", nargs="+")
    a = ap.parse_args()
    for src in a.src:
        slim_file(src, os.path.join(a.dest, os.path.basename(src)))


if __name__ == "__main__":
    main()
