#!/usr/bin/env python3
"""misses.py -- where a run's uncached prompt tokens come from: what routing could still win.

Experiment study (bench/results/study/): a reading tool for any `kvrouter bench` run's
requests.jsonl (the study's cells, an A/B's OUT folder); prints a table, writes no file.

Reads the requests.jsonl of a `kvrouter bench` run (real or --virtual) and, per label and level,
splits the measured requests' prompt tokens that were not served from the KV cache
(prompt_tokens - cached_tokens, from each answer's usage) by where the request went:

  first turn     a conversation's first request (nothing of its own to find; a shared starter or
                 document may still be cached on the worker chosen)
  moved          a later turn sent to another worker than the turn before it
  stayed         a later turn on the same worker as the turn before it: what the worker's cache no
                 longer held (evicted in the think time, or an answer that re-tokenized differently)
                 beyond the turn's new text
  unknown        a later turn whose previous turn is not in the file

and the floor of any routing: "new text", the tokens a later turn adds beyond the previous turn's
prompt and answer, which no cache can hold. Shares are of the measured requests' prompt tokens.

usage: bench/scripts/study/misses.py RUN_DIR_OR_REQUESTS_JSONL [...]
The standard library only.
"""
import collections
import json
import os
import sys


def load(path):
    if os.path.isdir(path):
        path = os.path.join(path, "requests.jsonl")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def breakdown(recs):
    conv = collections.defaultdict(list)
    for r in recs:
        conv[r["conversation"]].append(r)
    unc = collections.Counter()
    count = collections.Counter()
    total = new = 0
    for turns in conv.values():
        turns.sort(key=lambda r: r["turn"])
        prev = None
        for r in turns:
            if r["ok"] and not (r["warmup"] or r["cooldown"]):
                total += r["prompt_tokens"]
                if r["turn"] == 1:
                    kind = "first turn"
                elif prev is None or prev["turn"] != r["turn"] - 1 or not prev["ok"]:
                    kind = "unknown"
                else:
                    kind = "moved" if prev["worker"] != r["worker"] else "stayed"
                    grew = r["prompt_tokens"] - prev["prompt_tokens"] - prev["output_tokens"]
                    new += max(0, grew)
                unc[kind] += r["prompt_tokens"] - r["cached_tokens"]
                count[kind] += 1
            prev = r
    return total, new, unc, count


def main():
    if len(sys.argv) < 2:
        sys.stderr.write("usage: misses.py RUN_DIR_OR_REQUESTS_JSONL [...]\n")
        return 2
    print("| run | label | load | requests | prompt tokens | uncached | first turn | moved | "
          "stayed | unknown | new text (floor) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for path in sys.argv[1:]:
        try:
            recs = load(path)
        except (OSError, ValueError) as e:
            sys.stderr.write("misses.py: %s: %s\n" % (path, e))
            return 1
        keys = sorted({(r["label"], r.get("rate", r.get("users", 0))) for r in recs})
        for label, load_ in keys:
            sel = [r for r in recs
                   if r["label"] == label and r.get("rate", r.get("users", 0)) == load_]
            total, new, unc, count = breakdown(sel)
            if total == 0:
                continue
            pct = lambda k: "%.2f%% (%d)" % (100.0 * unc[k] / total, count[k])  # noqa: E731
            print("| %s | %s | %g | %d | %d | %.2f%% | %s | %s | %s | %s | %.2f%% |" % (
                os.path.basename(os.path.normpath(path)), label, load_, sum(count.values()), total,
                100.0 * sum(unc.values()) / total, pct("first turn"), pct("moved"), pct("stayed"),
                pct("unknown"), 100.0 * new / total))
    return 0


if __name__ == "__main__":
    sys.exit(main())
