#!/usr/bin/env python3
"""test_route_bench -- `kvrouter bench routing`'s report, read back and checked for consistency.

Runs the routing micro-benchmark small (4 KiB prompts, 20,000 indexed blocks, 300 decisions) and
parses its Markdown table and summary lines. Times are not judged (a shared machine is noisy);
what is checked is what the report must get right whatever the machine: every row of the table
with the sample count it says, percentiles in order, a decision costing at least each of its
parts, the steady-state line's per-block figure equal to its total over its blocks, the growth
line's blocks nearly all kept and its table large enough for them at the index's 90% load, its
longest insert within its total, and the memory line's bytes per entry equal to its bytes over its
entries. Also: a bad option (no workers; fewer blocks than workers) exits non-zero with one line on
stderr.

Run: python3 tests/bench/routing/test_route_bench.py --kvrouter build/kvrouter
(CTest: script.test_route_bench); exits 1 on a failure.
"""
import argparse
import re
import subprocess
import sys

BLOCKS = 20000
DECISIONS = 300


def run(kvrouter, *args):
    return subprocess.run([kvrouter, "bench", "routing", *args], capture_output=True, text=True,
                          timeout=300)


def table(out):
    rows = {}
    for line in out.splitlines():
        if not line.startswith("| ") or line.startswith("| step") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = {"n": int(cells[1]), "p50": float(cells[2]), "p99": float(cells[3]),
                          "mean": float(cells[4])}
    return rows


def one(pattern, out):
    m = re.search(pattern, out)
    assert m, f"no line matching {pattern!r} in:\n{out}"
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvrouter", required=True)
    kvr = ap.parse_args().kvrouter

    p = run(kvr, "--prompt-kib", "4", "--blocks", str(BLOCKS), "--decisions", str(DECISIONS))
    assert p.returncode == 0, p.stderr
    out = p.stdout
    rows = table(out)
    for phase in ("warm", "cold"):
        parts = [rows[f"{phase}: {k}"] for k in ("prompt features + hashing", "index match",
                                                   "policy select")]
        total = rows[f"{phase}: decision (hash + match + select)"]
        for r in parts + [total]:
            assert r["n"] == DECISIONS, (phase, r)
            assert 0 <= r["p50"] <= r["p99"], (phase, r)
        # Each decision's total is the sum of its parts, so its mean is the parts' means summed
        # (to the table's 0.1 us rounding).
        assert abs(total["mean"] - sum(r["mean"] for r in parts)) <= 0.15 + 1e-9, (phase, rows)
    for name in ("JSON parse (cJSON, separate)", "index insert/touch after the pick"):
        assert rows[name]["n"] == DECISIONS and rows[name]["p50"] <= rows[name]["p99"], rows[name]

    m = one(r"Index steady state: (\d+) more new blocks into the full index, evicting as many, "
            r"in ([0-9.]+) ms = ([0-9.]+) us per new block\.", out)
    n, ms, per = int(m[1]), float(m[2]), float(m[3])
    assert n == BLOCKS, m[0]
    assert per > 0 and abs(per - ms * 1000 / n) <= 0.006 + ms * 1000 / n * 0.01, m[0]

    m = one(r"Index growth \(not sized beforehand\): (\d+) blocks in ([0-9.]+) ms, ending with "
            r"(\d+) blocks in (\d+) table slots; longest single insert \(256 blocks and any rehash "
            r"they set off\) ([0-9.]+) ms; (\d+) inserts over 1 ms\.", out)
    n, total_ms, held, slots, longest = int(m[1]), float(m[2]), int(m[3]), int(m[4]), float(m[5])
    assert n == BLOCKS, m[0]
    # Round robin by chain leaves a worker a chain past its capacity, so a few blocks are evicted;
    # most stay, and the table holds them at most 90% full.
    assert BLOCKS * 0.95 <= held <= BLOCKS, m[0]
    assert slots * 0.9 >= held, m[0]
    assert 0 <= longest <= total_ms + 0.05, m[0]

    m = one(r"Index memory: (\d+) bytes allocated \((\d+) table slots x 20 B, (\d+) nodes x 16 B\) "
            r"for (\d+) \(block, worker\) entries, ([0-9.]+)% of the capacity it is sized for = "
            r"([0-9.]+) bytes per \(block, worker\) entry\.", out)
    nbytes, tslots, nodes, entries, bpe = int(m[1]), int(m[2]), int(m[3]), int(m[4]), float(m[6])
    assert nbytes >= tslots * 20 + nodes * 16, m[0]
    assert abs(bpe - nbytes / entries) <= 0.05, m[0]
    assert entries <= nodes, m[0]

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
