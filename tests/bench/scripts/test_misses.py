#!/usr/bin/env python3
"""test_misses -- bench/scripts/study/misses.py's breakdown of uncached prompt tokens, on
synthetic runs.

Writes a requests.jsonl whose every record is built by hand (only the keys misses.py reads), runs
the script as a child process, parses its Markdown row back and checks each share against the
arithmetic done here: first turns, moved and stayed turns, a turn whose predecessor is missing,
warm-up and failed requests left out, the new-text floor. Also: a bad path exits 1 with one line.

Run: python3 tests/bench/scripts/test_misses.py (CTest: script.test_misses); exits 1 on a failure.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "..", "bench", "scripts", "study", "misses.py")


def rec(conv, turn, worker, prompt, cached, output=10, warmup=False, ok=True, label="kv", rate=2.0):
    return {"label": label, "rate": rate, "conversation": conv, "turn": turn, "worker": worker,
            "prompt_tokens": prompt, "cached_tokens": cached, "output_tokens": output,
            "warmup": warmup, "cooldown": False, "ok": ok}


def run(recs):
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "requests.jsonl"), "w") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")
        p = subprocess.run([sys.executable, SCRIPT, d], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    rows = [line.strip("|").split("|") for line in p.stdout.splitlines()[2:]]
    return [[c.strip() for c in row] for row in rows]


def main():
    recs = [
        rec(1, 1, "0", 1000, 0, warmup=True),  # warm-up: left out, but the next turn's predecessor
        rec(1, 2, "0", 1100, 1000),             # stayed: 100 uncached, new text 1100-1000-10 = 90
        rec(1, 3, "1", 1200, 0),                # moved: 1200 uncached, new text 1200-1100-10 = 90
        rec(2, 1, "2", 500, 100),               # first turn: 400 uncached
        rec(3, 2, "3", 800, 700),               # unknown: no turn 1 in the file: 100
        rec(4, 1, "0", 999, 0, ok=False),       # failed: left out
        rec(5, 1, "1", 400, 400, label="rr"),   # another label: its own row
    ]
    rows = run(recs)
    assert len(rows) == 2, rows
    kv = [r for r in rows if r[1] == "kv"][0]
    total = 1100 + 1200 + 500 + 800
    assert kv[3] == "4" and kv[4] == str(total), kv
    pct = lambda n: "%.2f%%" % (100.0 * n / total)  # noqa: E731
    assert kv[5] == pct(100 + 1200 + 400 + 100), kv
    assert kv[6] == pct(400) + " (1)", kv
    assert kv[7] == pct(1200) + " (1)", kv
    assert kv[8] == pct(100) + " (1)", kv
    assert kv[9] == pct(100) + " (1)", kv
    assert kv[10] == pct(90 + 90), kv
    rr = [r for r in rows if r[1] == "rr"][0]
    assert rr[5] == "0.00%" and rr[6] == "0.00% (1)", rr
    p = subprocess.run([sys.executable, SCRIPT, "/nonexistent/run"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "misses.py" in p.stderr, p.stderr
    print("PASS test_misses")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as e:
        print("FAIL test_misses: %r" % (e,))
        sys.exit(1)
