#!/usr/bin/env python3
"""test_ab -- bench/scripts/ab/ab.sh end to end on a tiny A/B, and what it keeps.

Runs ab.sh on the control workload with round_robin and kv_aware at time scale 10, 2 simulated
seconds per level, 10 prompts, rates 1 and 2 (about 10 s: real `kvrouter sim` workers and `kvrouter
serve` on 127.0.0.1 through bench/scripts/ab/real_ab.sh, stopped by PID). Before the run the output
folder holds a level file an earlier run could have left; it must not reach the kept raw folder.
Checks: the raw folder has, for the workload, a stamp naming the bench command (cmd=) and the
options, a rates line per label, and exactly the level JSONs this run wrote (each label's printed
rate reproduced from its levels' verdicts: the highest passing rate below the lowest failing one);
the report has the workload's row with both rates and the run's command, and its first line
ab.sh's own command line and the commit. ab_report.py given this raw folder and a second one (the
same run relabelled as two other policies, as ab.sh would keep a run of the reference policies in
bench/results/ab/raw/refs) renders one row with all four policies and lists both runs; the same
folder given twice (a label in two folders) exits 1 with one line. A binary that is not executable
fails at once with one line and exit 2.

Run: python3 tests/bench/scripts/test_ab.py --kvrouter build/kvrouter (CTest: script.test_ab);
exits 1 on a failure.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
AB = os.path.join(HERE, "..", "..", "..", "bench", "scripts", "ab", "ab.sh")
REPORT = os.path.join(HERE, "..", "..", "..", "bench", "scripts", "ab", "ab_report.py")
TINY = {"AB_WORKLOADS": "control", "AB_POLICIES": "round_robin,kv_aware",
        "AB_LABELS": "phase0,phase3", "AB_TIME_SCALE": "10", "AB_WARMUP_S": "2", "AB_LEVEL_S": "2",
        "AB_NUM_PROMPTS": "10", "AB_START": "1", "AB_RESOLUTION": "1", "AB_SEARCH_MAX": "2",
        "AB_COOLDOWN_S": "0"}


def read_stamp(path):
    with open(path) as f:
        return dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)


def limit(levels):
    """The highest passing rate below the lowest failing one (None when none passed)."""
    fails = [r for r, ok in levels if not ok]
    low_fail = min(fails) if fails else float("inf")
    ok = [r for r, p in levels if p and r < low_fail]
    return max(ok) if ok else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvrouter", required=True)
    kvr = os.path.abspath(ap.parse_args().kvrouter)
    with tempfile.TemporaryDirectory() as d:
        out, raw, md = os.path.join(d, "out"), os.path.join(d, "raw"), os.path.join(d, "AB.md")
        stale = os.path.join(out, "control", "results")
        os.makedirs(stale)
        with open(os.path.join(stale, "phase0_rate9.99.json"), "w") as f:
            f.write("{}")
        env = dict(os.environ, AB_RAW=raw, **TINY)
        p = subprocess.run(["sh", AB, kvr, out, md], env=env, capture_output=True, text=True,
                           timeout=240)
        assert p.returncode == 0, (p.returncode, p.stderr, open(os.path.join(out, "control.log")).read()
                                   if os.path.exists(os.path.join(out, "control.log")) else "")
        w = os.path.join(raw, "control")
        st = read_stamp(os.path.join(w, "stamp"))
        for k in ("workload", "commit", "started", "took_s", "time_scale", "policies", "labels"):
            assert st.get(k), (k, st)
        assert st["workload"] == "control" and st["time_scale"] == "10", st
        assert st["cmd"].startswith("kvrouter bench --url URL --admin ADMIN --workload control --ab "
                                    "round_robin,kv_aware --labels phase0,phase3 --time-scale 10 "), st
        assert "--search" in st["cmd"] and "--search-max 2" in st["cmd"], st["cmd"]
        with open(os.path.join(w, "rates")) as f:
            rates = {a: float(b) for a, b in (line.split() for line in f)}
        assert sorted(rates) == ["phase0", "phase3"], rates
        files = sorted(os.path.basename(x) for x in glob.glob(os.path.join(w, "results", "*.json")))
        assert "phase0_rate9.99.json" not in files, files  # the earlier run's file stayed behind
        written = sorted(os.path.basename(x) for x in glob.glob(os.path.join(stale, "*.json"))
                         if not x.endswith("9.99.json"))
        assert files == written, (files, written)
        for label, rate in rates.items():
            levels = []
            for x in glob.glob(os.path.join(w, "results", label + "_rate*.json")):
                with open(x) as f:
                    j = json.load(f)
                levels.append((float(os.path.basename(x)[len(label) + 5:-5]),
                               bool(j["kvrouter"]["slo_pass"])))
            assert levels, label
            assert (limit(levels) or 0.0) == rate, (label, rate, levels)
        with open(md) as f:
            report = f.read()
        # the first line: ab.sh's own command (its AB_* variables in front) and the commit
        first = report.splitlines()[0]
        assert first.startswith("Made by `AB_") and " sh " in first and "ab/ab.sh " in first, first
        assert "AB_WORKLOADS=control" in first and " at commit " in first, first
        row = [line for line in report.splitlines() if line.startswith("| control |")]
        assert len(row) == 1, report
        cells = [c.strip() for c in row[0].strip("|").split("|")]
        assert cells[1] == "10", cells
        assert [float(c) for c in cells[2:4]] == [rates["phase0"], rates["phase3"]], (cells, rates)
        assert st["cmd"] in report, report

        # A second raw folder: the same run as gie_scorer/sglang_cache_aware (labels gie, sglang).
        raw2 = os.path.join(d, "raw2")
        w2 = os.path.join(raw2, "control")
        os.makedirs(os.path.join(w2, "results"))
        rename = {"phase0": "gie", "phase3": "sglang"}
        with open(os.path.join(w2, "stamp"), "w") as f:
            for k, v in st.items():
                v = {"policies": "gie_scorer,sglang_cache_aware", "labels": "gie,sglang",
                     "cmd": v.replace("round_robin,kv_aware", "gie_scorer,sglang_cache_aware")
                     }.get(k, v)
                f.write("%s=%s\n" % (k, v))
        with open(os.path.join(w2, "rates"), "w") as f:
            f.writelines("%s %g\n" % (rename[a], b) for a, b in rates.items())
        for x in glob.glob(os.path.join(w, "results", "*.json")):
            with open(x) as f:
                j = json.load(f)
            base = os.path.basename(x)
            label = base.split("_rate")[0]
            j["label"] = rename[label]
            with open(os.path.join(w2, "results", rename[label] + base[len(label):]), "w") as f:
                json.dump(j, f)
        md2 = os.path.join(d, "AB2.md")
        p = subprocess.run([sys.executable, REPORT, raw, raw2, md2], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, p.stderr
        with open(md2) as f:
            report2 = f.read()
        head = [line for line in report2.splitlines() if line.startswith("| workload |")][0]
        assert [c.strip() for c in head.strip("|").split("|")][2:6] == [
            "round_robin", "kv_aware", "gie_scorer", "sglang_cache_aware"], head
        row = [line for line in report2.splitlines() if line.startswith("| control |")]
        assert len(row) == 1, report2
        cells = [c.strip() for c in row[0].strip("|").split("|")]
        assert [float(c) for c in cells[2:6]] == [rates["phase0"], rates["phase3"]] * 2, cells
        assert "levels say" not in row[0], row  # each label's rate reproduced from its own levels
        runs = [line for line in report2.splitlines() if line.startswith("- control: ")]
        assert len(runs) == 2 and "gie_scorer,sglang_cache_aware" in runs[1], runs
        p = subprocess.run([sys.executable, REPORT, raw, raw, md2], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1, (p.returncode,
                                                                              p.stderr)
        assert "two raw folders" in p.stderr, p.stderr

        env = dict(os.environ, AB_RAW=raw, **TINY)
        p = subprocess.run(["sh", AB, os.path.join(d, "nonexistent"), out, md], env=env,
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, (p.returncode, p.stderr)
    print("test_ab: ok")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as e:
        print("test_ab: FAILED: %r" % (e,), file=sys.stderr)
        sys.exit(1)
