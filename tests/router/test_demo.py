#!/usr/bin/env python3
"""test_demo.py -- `kvrouter demo --quick` end to end: real processes on 127.0.0.1.

Checks that the demo starts 4 simulated workers and the router, runs the round-robin vs KV-aware
A/B, writes every report file with the expected tables, prints the summary, and leaves no child
process behind, also when interrupted with Ctrl-C (SIGINT) in the middle of the benchmark.

Usage: python3 tests/router/test_demo.py --kvrouter PATH/TO/kvrouter [-k NAME] [-v]
The harness is tests/harness/kvrharness.py.
"""
import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import Proc, percentile  # noqa: E402

TESTS, test = h.registry()


def child_pids(stderr_text):
    return [int(p) for p in re.findall(r"started .* pid (\d+)", stderr_text)]


def assert_gone(pids, deadline_s=5.0):
    end = time.time() + deadline_s
    for pid in pids:
        while os.path.exists("/proc/%d" % pid):
            # A reaped child disappears; anything else still running is a leak.
            with open("/proc/%d/stat" % pid) as f:
                if f.read().split()[2] == "Z":
                    break
            if time.time() > end:
                raise AssertionError("child pid %d still running after the demo exited" % pid)
            time.sleep(0.05)


@test(timeout=150)
def test_quick():
    with tempfile.TemporaryDirectory(prefix="kvr_demo_test_") as tmp:
        check_quick(os.path.join(tmp, "quick"))


def check_quick(out):
    t0 = time.time()
    p = subprocess.run([h.KVROUTER, "demo", "--quick", "--out", out], capture_output=True,
                       text=True, timeout=120)
    elapsed = time.time() - t0
    assert p.returncode == 0, "demo failed (%d):\n%s\n%s" % (p.returncode, p.stdout, p.stderr)
    assert elapsed < 60, "demo --quick took %.1f s" % elapsed
    pids = child_pids(p.stderr)
    assert len(pids) == 5, "expected 4 workers + router, saw %r" % pids
    assert_gone(pids)

    # Summary: max SLO-compliant rate per phase and the gain.
    assert re.search(r"phase0\s+\d+\.\d+ RPS", p.stdout), p.stdout
    # The gain, or (when a slow build fails every level) that the baseline passed nowhere.
    assert re.search(r"phase3\s+\d+\.\d+ RPS\s+\(([+-]\d+% vs phase0|baseline passed at no load)\)",
                     p.stdout), p.stdout

    md = open(os.path.join(out, "report.md")).read()
    for heading in ["## Configuration", "## SLO Targets", "## Results \u2014 TTFT p99 (ms)",
                    "## Results \u2014 TPOT p99 (ms)", "## Results \u2014 Output Throughput (tok/s)",
                    "## Results \u2014 Max Concurrent Requests", "## SLO Compliance Matrix",
                    "## Winner Identification", "## Detailed Comparison at Baseline",
                    "## Per-Turn TTFT", "## Worker Share", "## Key Observations",
                    "## Workload Parameters"]:
        assert heading in md, "missing %r in report.md" % heading
    assert "| round_robin |" in md and "| kv_aware |" in md
    matrix = md.split("## SLO Compliance Matrix")[1].split("##")[0]
    rows = [l for l in matrix.splitlines() if re.match(r"\| \d+\.\d+ \|", l)]
    assert len(rows) == 3, matrix
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")][1:]
        assert len(cells) == 2 and all(re.match(r"^(PASS|FAIL \(.+\))$", c) for c in cells), row

    html = open(os.path.join(out, "report.html")).read()
    assert html.count("<svg") == 4 and 'class="slo"' in html

    lines = [json.loads(l) for l in open(os.path.join(out, "requests.jsonl"))]
    results = sorted(glob.glob(os.path.join(out, "results", "*.json")))
    assert len(results) == 6, results
    for path in results:
        r = json.load(open(path))
        assert r["completed"] + r["failed"] == 60, path
        # each label ran its own policy (the demo's A/B: phase0 round_robin, phase3 kv_aware)
        policy = {"phase0": "round_robin", "phase3": "kv_aware"}.get(r["label"])
        assert r["kvrouter"]["policy"] == policy, (path, r["label"], r["kvrouter"]["policy"])
        # The level's p99s are its requests': TTFT over its ttfts (seconds), TPOT over the
        # records of its label and rate (completed, measured, more than one token).
        ttfts = [t * 1000 for t in r["ttfts"] if t > 0]
        assert ttfts and abs(r["p99_ttft_ms"] - percentile(ttfts, 99)) < 0.01, (path, r["p99_ttft_ms"])
        tpots = [q["tpot_ms"] for q in lines if q["label"] == r["label"] and q["ok"]
                 and not q["warmup"] and q["rate"] == r["request_rate"] and q["output_tokens"] > 1]
        assert tpots and abs(r["p99_tpot_ms"] - percentile(tpots, 99)) < 0.01, (
            path, r["p99_tpot_ms"], percentile(tpots, 99))

    assert len(lines) == 360, len(lines)
    assert all(l["worker"] != "" for l in lines if l["ok"]), "a response lacked x-kvrouter-worker"
    assert len({l["worker"] for l in lines}) == 4
    assert sum(l["cached_tokens"] for l in lines) > 0, "no cached tokens reported"
    assert max(l["turn"] for l in lines) >= 2, "no follow-up turn was sent"


@test(timeout=120)
def test_options_after_dashdash_replace_the_demos_own():
    """`demo -- --rates R --ab P,Q --labels A,B`: the caller's lists replace the demo's own (the
    bench's option engine appends a repeated list, so the demo must leave its own out)."""
    with tempfile.TemporaryDirectory(prefix="kvr_demo_test_") as tmp:
        out = os.path.join(tmp, "own")
        p = subprocess.run([h.KVROUTER, "demo", "--quick", "--out", out, "--",
                            "--rates", "6", "--ab", "round_robin,least_load", "--labels", "a,b"],
                           capture_output=True, text=True, timeout=100)
        assert p.returncode == 0, "demo failed (%d):\n%s\n%s" % (p.returncode, p.stdout, p.stderr)
        assert_gone(child_pids(p.stderr))
        levels = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(out, "results", "*.json")))]
        seen = sorted((r["label"], r["kvrouter"]["policy"], r["request_rate"]) for r in levels)
        assert seen == [("a", "round_robin", 6.0), ("b", "least_load", 6.0)], seen


@test(timeout=60)
def test_mixed_fleet_worker_blocks():
    """`--worker-blocks` gives each simulated worker its own KV cache (a mixed fleet); a count that
    does not match --workers is a one-line error."""
    with tempfile.TemporaryDirectory(prefix="kvr_demo_test_") as tmp:
        out = os.path.join(tmp, "mixed")
        p = subprocess.run([h.KVROUTER, "demo", "--quick", "--workers", "2", "--worker-blocks",
                            "3000,1500", "--out", out, "--", "--rates", "2", "--num-prompts", "6",
                            "--ab", "round_robin", "--labels", "a"],
                           capture_output=True, text=True, timeout=50)
        assert p.returncode == 0, "demo failed (%d):\n%s\n%s" % (p.returncode, p.stdout, p.stderr)
        assert_gone(child_pids(p.stderr))
        for w, blocks in ((0, 3000), (1, 1500)):
            with open(os.path.join(out, "logs", "worker-%d.log" % w)) as f:
                log = f.read()
            assert "num_gpu_blocks=%d\n" % blocks in log, (w, log[:400])
        p = subprocess.run([h.KVROUTER, "demo", "--worker-blocks", "100,200"], capture_output=True,
                           text=True, timeout=10)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, (p.returncode, p.stderr)
        assert "--worker-blocks: 2 values for 4 workers" in p.stderr, p.stderr


@test(timeout=90)
def test_ctrl_c():
    with tempfile.TemporaryDirectory(prefix="kvr_demo_test_") as tmp:
        check_ctrl_c(os.path.join(tmp, "interrupted"))


def check_ctrl_c(out):
    p = Proc([h.KVROUTER, "demo", "--quick", "--out", out], "demo")
    try:
        p.wait_line(r"running the A/B", timeout=30)
        time.sleep(2.0)
        p.signal(signal.SIGINT)
        rc = p.wait(30)
        assert rc is not None, "demo did not stop within 30 s of SIGINT"
    finally:
        p.kill()
    err = p.stderr_text()
    assert rc == 130, "exit %d after SIGINT:\n%s" % (rc, err)
    pids = child_pids(err)
    assert len(pids) == 5
    assert_gone(pids)
    # The partial report of what finished is still written.
    assert os.path.exists(os.path.join(out, "report.md"))


if __name__ == "__main__":
    sys.exit(h.run(TESTS, description=__doc__.splitlines()[0]))
