#!/usr/bin/env python3
"""test_demo.py -- `kvrouter demo --quick` end to end: real processes on 127.0.0.1.

Checks that the demo starts 4 simulated workers and the router, runs the round-robin vs KV-aware
A/B, writes every report file with the expected tables, prints the summary, and leaves no child
process behind, also when interrupted with Ctrl-C (SIGINT) in the middle of the benchmark.

Usage: python3 test_demo.py --kvrouter PATH/TO/kvrouter
"""
import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time


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


def test_quick(kvrouter, tmp):
    out = os.path.join(tmp, "quick")
    t0 = time.time()
    p = subprocess.run([kvrouter, "demo", "--quick", "--out", out], capture_output=True,
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

    results = sorted(glob.glob(os.path.join(out, "results", "*.json")))
    assert len(results) == 6, results
    for path in results:
        r = json.load(open(path))
        assert r["completed"] + r["failed"] == 60, path
        assert r["p99_ttft_ms"] > 0 and r["p99_tpot_ms"] > 0, path
        assert r["kvrouter"]["policy"] in ("round_robin", "kv_aware")

    lines = [json.loads(l) for l in open(os.path.join(out, "requests.jsonl"))]
    assert len(lines) == 360, len(lines)
    assert all(l["worker"] != "" for l in lines if l["ok"]), "a response lacked x-kvrouter-worker"
    assert len({l["worker"] for l in lines}) == 4
    assert sum(l["cached_tokens"] for l in lines) > 0, "no cached tokens reported"
    assert max(l["turn"] for l in lines) >= 2, "no follow-up turn was sent"


def test_ctrl_c(kvrouter, tmp):
    out = os.path.join(tmp, "interrupted")
    p = subprocess.Popen([kvrouter, "demo", "--quick", "--out", out], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    err = ""
    deadline = time.time() + 30
    while "running the A/B" not in err:
        line = p.stderr.readline()
        assert line or p.poll() is None, "demo exited early:\n" + err
        err += line
        assert time.time() < deadline, "demo never started the A/B:\n" + err
    time.sleep(2.0)
    p.send_signal(signal.SIGINT)
    try:
        rest_out, rest_err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError("demo did not stop within 30 s of SIGINT")
    err += rest_err
    assert p.returncode == 130, "exit %d after SIGINT:\n%s" % (p.returncode, err)
    pids = child_pids(err)
    assert len(pids) == 5
    assert_gone(pids)
    # The partial report of what finished is still written.
    assert os.path.exists(os.path.join(out, "report.md"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvrouter", required=True)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kvr_demo_test_")
    try:
        for test in (test_quick, test_ctrl_c):
            t0 = time.time()
            test(os.path.abspath(args.kvrouter), tmp)
            print("ok %s (%.1f s)" % (test.__name__, time.time() - t0))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
