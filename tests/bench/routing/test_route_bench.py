#!/usr/bin/env python3
"""test_route_bench -- `kvrouter bench routing`'s report, read back and checked for consistency.

Runs the routing micro-benchmark small (4 KiB prompts, 20,000 indexed blocks, 300 decisions) at 2
and 4 workers (two runs: `--workers 2,4`) and parses each run's Markdown table and summary lines,
then the summary table. Times are not judged (a shared machine is noisy); what is checked is what
the report must get right whatever the machine: one section per run and one summary row per run
with that section's figures, every row of a table with the sample count it says, percentiles in
order and at most the maximum, a decision costing at least each of its parts, the steady-state
line's per-block figure equal to its total over its blocks, the growth line's blocks nearly all
kept and its table large enough for them at the index's 90% load, its longest insert within its
total and equal to its table row's maximum, and the memory line's bytes per entry equal to its
bytes over its entries. Also: a bad option (no workers; fewer blocks than workers) exits non-zero
with one line on stderr.

Run: python3 tests/bench/routing/test_route_bench.py --kvrouter build/kvrouter
(CTest: script.test_route_bench); exits 1 on a failure.
"""
import argparse
import re
import subprocess
import sys

BLOCKS = 20000
DECISIONS = 300
WORKERS = (2, 4)
CHAINS = (BLOCKS + 255) // 256  # the 256-block inserts of the steady-state and growth lines


def run(kvrouter, *args):
    return subprocess.run([kvrouter, "bench", "routing", *args], capture_output=True, text=True,
                          timeout=300)


def table(out):
    rows = {}
    for line in out.splitlines():
        if not line.startswith("| ") or line.startswith("| step") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != 7:
            continue  # the summary table
        rows[cells[0]] = {"n": int(cells[1]), "p50": float(cells[2]), "p99": float(cells[3]),
                          "max": float(cells[4]), "mean": float(cells[5])}
    return rows


def one(pattern, out):
    m = re.search(pattern, out)
    assert m, f"no line matching {pattern!r} in:\n{out}"
    return m


def check_run(workers, out, srow):
    """One run's section against itself and against its summary row srow (cells)."""
    assert out.startswith(f" (policy kv_aware, {workers} workers, {BLOCKS} blocks)"), out[:80]
    rows = table(out)
    for phase in ("warm", "cold"):
        parts = [rows[f"{phase}: {k}"] for k in ("prompt features + hashing", "index match",
                                                   "snapshots + policy select")]
        total = rows[f"{phase}: decision (hash + match + select)"]
        for r in parts + [total]:
            assert r["n"] == DECISIONS, (phase, r)
            assert 0 <= r["p50"] <= r["p99"] <= r["max"], (phase, r)
        # Each decision's total is the sum of its parts, so its mean is the parts' means summed
        # (to the table's 0.1 us rounding).
        assert abs(total["mean"] - sum(r["mean"] for r in parts)) <= 0.15 + 1e-9, (phase, rows)
    for name in ("JSON parse (cJSON, separate)", "index insert/touch after the pick"):
        assert rows[name]["n"] == DECISIONS and rows[name]["p50"] <= rows[name]["p99"], rows[name]
    for name in ("index: 256 new blocks into the full index",
                 "index: 256 new blocks while it grows"):
        r = rows[name]
        assert r["n"] == CHAINS and 0 <= r["p50"] <= r["p99"] <= r["max"], (name, r)

    m = one(r"Index steady state: (\d+) more new blocks into the full index, evicting as many, "
            r"in ([0-9.]+) ms = ([0-9.]+) us per new block; longest insert of 256 ([0-9.]+) us; "
            r"(\d+) inserts over 1 ms \((\d+) of them preempted, (\d+) faulting in pages\); "
            r"([0-9.]+) cuckoo moves per new block\.", out)
    n, ms, per = int(m[1]), float(m[2]), float(m[3])
    assert n == BLOCKS, m[0]
    assert per > 0 and abs(per - ms * 1000 / n) <= 0.006 + ms * 1000 / n * 0.01, m[0]
    assert float(m[4]) == rows["index: 256 new blocks into the full index"]["max"], m[0]
    assert int(m[6]) + int(m[7]) <= int(m[5]) <= CHAINS, m[0]

    m = one(r"Index growth \(not sized beforehand\): (\d+) blocks in ([0-9.]+) ms, ending with "
            r"(\d+) blocks in (\d+) table slots after (\d+) bucket splits; longest single insert "
            r"\(256 blocks and the splits they set off\) ([0-9.]+) ms; (\d+) inserts over 1 ms "
            r"\((\d+) of them preempted, (\d+) faulting in pages\); ([0-9.]+) bytes per \(block, "
            r"worker\) entry at the end; ([0-9.]+) cuckoo moves per new block\.", out)
    n, total_ms, held, slots = int(m[1]), float(m[2]), int(m[3]), int(m[4])
    splits, longest, slow, preempted, faulted = (int(m[5]), float(m[6]), int(m[7]), int(m[8]),
                                                 int(m[9]))
    assert n == BLOCKS, m[0]
    # Round robin by chain leaves a worker a chain past its capacity, so a few blocks are evicted;
    # most stay, and the table holds them at most 90% full, grown from 16 buckets by splits.
    assert BLOCKS * 0.95 <= held <= BLOCKS, m[0]
    assert slots * 0.9 >= held and slots == 4 * (16 + splits), m[0]
    assert 0 <= longest <= total_ms + 0.05, m[0]
    # (the line in ms to 3 decimals, the table in us to 1)
    assert abs(longest * 1000 - rows["index: 256 new blocks while it grows"]["max"]) <= 0.56, m[0]
    assert 0 <= preempted + faulted <= slow <= CHAINS, m[0]

    m = one(r"Index memory: (\d+) bytes allocated \((\d+) table slots x 16 B in 2 MiB chunks, "
            r"(\d+) nodes x 16 B, (\d+) wide holder sets\) for (\d+) \(block, worker\) entries, "
            r"([0-9.]+)% of the capacity it is sized for = ([0-9.]+) bytes per \(block, worker\) "
            r"entry\.", out)
    nbytes, tslots, nodes, entries, bpe = (int(m[1]), int(m[2]), int(m[3]), int(m[5]),
                                           float(m[7]))
    assert nbytes >= tslots * 16 + nodes * 16, m[0]
    assert abs(bpe - nbytes / entries) <= 0.05, m[0]
    assert entries <= nodes, m[0]

    # The summary row repeats the section's figures.
    assert int(srow[0]) == workers and int(srow[1]) == BLOCKS, srow
    assert float(srow[2]) == rows["warm: decision (hash + match + select)"]["p99"], srow
    assert float(srow[3]) == rows["cold: decision (hash + match + select)"]["p99"], srow
    assert float(srow[8]) == bpe, srow
    assert abs(float(srow[10]) - longest) <= 0.0005, srow
    assert srow[11] == f"{slow} ({preempted}, {faulted})", srow


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvrouter", required=True)
    kvr = ap.parse_args().kvrouter

    p = run(kvr, "--prompt-kib", "4", "--blocks", str(BLOCKS), "--decisions", str(DECISIONS),
            "--workers", ",".join(str(w) for w in WORKERS))
    assert p.returncode == 0, p.stderr
    head, _, summary = p.stdout.partition("## Summary")
    sections = head.split("## Routing decision cost")[1:]
    assert len(sections) == len(WORKERS), p.stdout
    srows = [line for line in summary.splitlines() if re.match(r"\| \d", line)]
    assert len(srows) == len(WORKERS), summary
    for workers, out, srow in zip(WORKERS, sections, srows):
        check_run(workers, out, [c.strip() for c in srow.strip("|").split("|")])

    for bad in (["--workers", "0"], ["--blocks", "3", "--workers", "4"]):
        p = run(kvr, *bad)
        assert p.returncode != 0 and len(p.stderr.strip().splitlines()) == 1, (bad, p.stderr)
    print("test_route_bench: ok")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as e:
        print(f"test_route_bench: FAILED: {e}", file=sys.stderr)
        sys.exit(1)
