#!/usr/bin/env python3
"""test_calibrate_grid -- bench/scripts/calibration/calibrate_grid.py: candidates in, one ranked
line each out.

Owns the checks of the grid script: its candidate file reader, its summary of a noise part's
summary.json (means over seeds, figures judged on their medians, max SLO rates equal to the seed
report's), and one tiny real grid end to end (two candidates and a bad one, `kvrouter bench
--virtual` through calibrate.py: no network, no server, a few seconds).

Run: python3 tests/bench/scripts/test_calibrate_grid.py --kvrouter build/kvrouter (CTest:
script.test_calibrate_grid); kvrharness's runner prints one PASS/FAIL line per test and exits 1
when one failed.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "..", "..", "..", "bench", "scripts", "calibration")
SCRIPT = os.path.join(SCRIPTS, "calibrate_grid.py")
sys.path.insert(0, SCRIPTS)
sys.path.insert(0, os.path.join(HERE, "..", "..", "harness"))
import calibrate_grid  # noqa: E402
import kvrharness as h  # noqa: E402

TESTS, test = h.registry()


@test()
def candidates_file():
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "c.txt")
        with open(p, "w") as f:
            f.write("# a comment\n\nbase\nwide --bench-arg=--output-std=300  # why\n"
                    "both --sim-arg=--cost-weights-ms=22 '--bench-arg=--title=a b'\n")
        assert calibrate_grid.read_candidates(p) == [
            ("base", []), ("wide", ["--bench-arg=--output-std=300"]),
            ("both", ["--sim-arg=--cost-weights-ms=22", "--bench-arg=--title=a b"])]
        # A name given twice, or one that is not a plain folder name (a path, .., a flag: the
        # name is a folder below DIR that a rerun deletes), stops at its line.
        for bad, why in (("base --rates=1", "c.txt:6: candidate base named twice"),
                         ("..", "c.txt:6: '..' is not a candidate name"),
                         ("../x", "c.txt:6: '../x' is not a candidate name"),
                         ("/tmp/x", "c.txt:6: '/tmp/x' is not a candidate name"),
                         (".hidden", "c.txt:6: '.hidden' is not a candidate name"),
                         ("--sim-arg=--cost-step-ms=2", "'--sim-arg=--cost-step-ms=2' is not a")):
            with open(p) as f:
                lines = f.readlines()[:5]
            with open(p, "w") as f:
                f.writelines(lines + [bad + "\n"])
            try:
                calibrate_grid.read_candidates(p)
            except SystemExit as e:
                assert why in str(e), (bad, str(e))
            else:
                raise AssertionError("accepted: %r" % bad)
        assert calibrate_grid.NAME.match("w22d45_os-300.b+1")


@test()
def summary_figures():
    summary = {"seeds": ["42", "1"], "configs": ["phase0", "mem095"],
               "per_seed": {
                   "42": {"in_sample": [30, 39, 12.0], "out_of_sample": [40, 70, 20.0],
                          "max_slo_rate": {"phase0": 2.0, "mem095": 2.5}},
                   "1": {"in_sample": [35, 39, 8.0], "out_of_sample": [50, 70, None],
                         "max_slo_rate": {"phase0": 1.5, "mem095": 2.0}}},
               "figures": [
                   # in-sample by its key: median 700 of 981, 28.6% off: not within
                   {"config": "phase0", "load": "1.50 req/s", "figure": "TTFT p99 (ms)",
                    "seed": 981, "in_sample": True, "sims": [900, 500]},
                   # in-sample by config (older summaries): median 30 of 29, within
                   {"config": "phase0", "load": "0.50 req/s", "figure": "TPOT p99 (ms)",
                    "seed": 29, "sims": [28, 32]},
                   # out-of-sample, exactly 20% off: within (|error| <= 20%)
                   {"config": "phase1-mem095", "load": "5.00 req/s", "figure": "max concurrent",
                    "seed": 150, "in_sample": False, "sims": [180, None]},
                   # nothing measured: left out
                   {"config": "phase1-mem095", "load": "4.00 req/s", "figure": "TTFT p99 (ms)",
                    "seed": 1013, "in_sample": False, "sims": [None, None]}]}
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "summary.json")
        with open(p, "w") as f:
            json.dump(summary, f)
        s = calibrate_grid.summarize(p)
    assert s["in"] == 32.5 and s["in_n"] == 39 and s["in_mae"] == 10.0, s
    # An MAE of None (nothing measured under that seed) is left out of the mean, not taken as 0.
    assert s["oos"] == 45.0 and s["oos_n"] == 70 and s["oos_mae"] == 20.0, s
    assert s["med_in"] == [1, 2] and s["med_oos"] == [1, 1], s
    # The report's 2.0: phase0 2.0 under 42 and mem095 2.0 under 1 equal, mem095 2.5 above,
    # phase0 1.5 below.
    assert s["slo"] == [2, 4, 1, 1], s
    text = calibrate_grid.line("x", s)
    assert text.startswith("x ") and "in 32.5/39 MAE 10.0%" in text, text
    assert text.endswith("oos  45.0/70 MAE 20.0%  medians in 1/2 oos 1/1  slo 2/4 (1 above, 1 "
                         "below)"), text
    # An MAE no seed measured prints "-"; a perfect one stays 0.0%, not taken for missing.
    text = calibrate_grid.line("z", dict(s, in_mae=0.0, oos_mae=None))
    assert "in 32.5/39 MAE  0.0%  oos  45.0/70 MAE    -  medians" in text, text
    # Paired against a reference on the seeds both ran (42 and 1; 7 only in the reference):
    # in-sample 30-28, 35-33: +2.0 +- 0.0; out-of-sample 40-30, 50-50: +5.0, sd 7.07 / sqrt 2.
    ref = {"per_seed": {"42": (28, 30), "1": (33, 50), "7": (0, 0)}}
    assert calibrate_grid.paired(s, ref) == [2.0, 0.0, 5.0, 5.0, 2], calibrate_grid.paired(s, ref)
    text = calibrate_grid.line("x", s, "base", ref)
    assert text.endswith("slo 2/4 (1 above, 1 below)  vs base: in +2.0 +- 0.0, oos +5.0 +- 5.0 "
                         "(2 seeds)"), text
    assert calibrate_grid.paired(s, {"per_seed": {"42": (1, 1)}}) is None  # one seed: no error
    # A summary without a single seed: None, and a line that says so.
    summary["seeds"] = []
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "summary.json")
        with open(p, "w") as f:
            json.dump(summary, f)
        assert calibrate_grid.summarize(p) is None
    assert calibrate_grid.line("y", None, "x", s) == "y: no bench seed in its summary"


@test(timeout=120)
def tiny_grid_end_to_end():
    tiny = "--rates=0.5 --configs=mem095 --bench-arg=--num-prompts=12 --bench-arg=--warmup=0"
    with tempfile.TemporaryDirectory() as d:
        cands = os.path.join(d, "c.txt")
        with open(cands, "w") as f:  # the first fails: the paired reference is the next
            f.write("bad %s --sim-arg=--cost-weights-ms=-1\n" % tiny)
            f.write("base %s\nwide %s --bench-arg=--output-std=400\n" % (tiny, tiny))
        out = os.path.join(d, "grid")
        r = subprocess.run([sys.executable, SCRIPT, "--candidates", cands, "--dir", out,
                            "--kvrouter", h.KVROUTER, "--noise-seeds", "42,1", "--jobs", "2"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)  # "bad" failed
        lines = r.stdout.strip().splitlines()
        assert [x.split()[0] for x in lines] == ["bad:", "base", "wide"], r.stdout
        assert "calibrate.py exited with status" in lines[0], lines[0]
        # 0.5 req/s alone with 12 prompts on a cold cache fails the SLO (TTFT p99 ~1.2 s: cold
        # starters, no warm-up): every (config, seed) pair's rate is 0, never the report's 2.0,
        # so 0 of 2 configs x 2 seeds; "wide" paired against "base".
        assert lines[1].endswith(" slo 0/4 (0 above, 4 below)"), lines[1]
        assert "vs " not in lines[1] and "vs base: in " in lines[2], lines
        assert lines[2].endswith("(2 seeds)"), lines[2]
        with open(os.path.join(out, "base", "raw", "noise", "summary.json")) as f:
            got = json.load(f)["per_seed"]
        assert got["42"]["max_slo_rate"] == {"phase0": 0.0, "mem095": 0.0}, got["42"]
        for name in ("base", "wide"):
            assert os.path.exists(os.path.join(out, name, "raw", "noise", "summary.json"))
            assert not os.path.exists(os.path.join(out, name, "out"))  # the bench output went
        # The same lines again from the raw files alone.
        r2 = subprocess.run([sys.executable, SCRIPT, "--candidates", cands, "--dir", out,
                             "--summarize-only"], capture_output=True, text=True, timeout=60)
        assert r2.stdout.splitlines()[1:] == lines[1:], (r2.stdout, lines)
        assert r2.returncode == 1 and r2.stdout.startswith("bad: no "), r2.stdout


if __name__ == "__main__":
    sys.exit(h.run(TESTS, description=__doc__.splitlines()[0]))
