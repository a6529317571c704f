#!/usr/bin/env python3
"""agreement.py -- how well `kvrouter bench --virtual` agrees with the real-time A/B.

Experiment agreement (bench/results/agreement/): does a virtual-time run give the real-time A/B's
max SLO-compliant rates? Writes AGREEMENT_MD (committed: bench/results/agreement/REPORT.md from
bench/results/ab/raw/main and raw/refs, agreement/tuned/REPORT.md from ab/raw/tuned), its first
line the command that made it and the commit (bench/scripts/lib/provenance.py), and the virtual
runs under OUT (not kept).

The real-time A/B (bench/scripts/ab/ab.sh) keeps, per workload, its stamp (time scale and the bench
command, cmd=; demo_cmd= in folders from before the ninth session, when ab.sh ran `kvrouter
demo`) and each label's max SLO-compliant rate in AB_RAW/<workload>/, and the per-level JSON in
AB_RAW/<workload>/results/. This script reruns every workload in virtual time
with the same bench flags and the same seed -- so the same request traces -- and the delays the
real run had at its time scale: the demo that ran it (commit 775aa0e, and
bench/scripts/ab/real_ab.sh) started `kvrouter serve --scrape-interval-ms 100` with the default 5 s
staleness, real time, which at time scale S are 100 S ms and 5 S s simulated. It then writes
AGREEMENT_MD:
per workload and policy the real and the virtual max SLO-compliant rate and their difference (the
issue's bar: within 7%), the mean over three seeds in virtual time, and, for every (label, rate)
level both runs measured, TTFT p99 and TPOT p99 side by side.

usage: bench/scripts/agreement/agreement.py KVROUTER OUT AGREEMENT_MD RAW_FOLDER... [--seeds N]
       [--params LABEL=JSON ...]
RAW_FOLDER: an AB_RAW folder of ab.sh (a folder per workload: stamp with cmd or demo_cmd, rates,
results/) or an OUT folder of bench/scripts/ab/real_ab.sh (stamp with cmd, summary.txt, results/),
or a folder of those. --params is passed to the virtual runs as --policy-params (e.g. the
parameters a policy had when the real run was made).
The standard library only.
"""
import argparse
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from provenance import first_line  # noqa: E402


def stamp(path):
    out = {}
    with open(path) as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition("=")
            out[k] = v
    return out


def rates(folder):
    """ab.sh's rates file ("<label> <rate>"), or the bench summary real_ab.sh keeps."""
    out = {}
    if os.path.exists(os.path.join(folder, "rates")):
        with open(os.path.join(folder, "rates")) as f:
            for line in f:
                p = line.split()
                if len(p) == 2:
                    out[p[0]] = float(p[1])
        return out
    with open(os.path.join(folder, "summary.txt")) as f:
        for line in f:
            m = re.match(r"\s+(\S+)\s+([0-9.]+) RPS", line)
            if m:
                out[m.group(1)] = float(m.group(2))
    return out


def levels(folder):
    out = {}
    for f in glob.glob(os.path.join(folder, "*_rate*.json")):
        b = os.path.basename(f)[:-5]
        label, _, r = b.rpartition("_rate")
        with open(f) as fh:
            j = json.load(fh)
        out[(label, float(r))] = (j.get("p99_ttft_ms"), j.get("p99_tpot_ms"))
    return out


def bench_flags(st):
    """The bench flags of the real run: the workload, policies, labels, seed and the plan."""
    if "cmd" in st:  # real_ab.sh: a bench command line already
        argv = shlex.split(st["cmd"])
        flags, i = [], 2
        while i < len(argv):
            a = argv[i]
            if a in ("--url", "--admin", "--time-scale", "--out"):
                i += 2
                continue
            if a in ("--quiet", "--multiturn-mode"):
                i += 2 if a == "--multiturn-mode" else 1
                continue
            flags.append(a)
            i += 1
        return flags
    argv = shlex.split(st["demo_cmd"])
    flags, after = [], False
    i = 2  # "kvrouter demo"
    while i < len(argv):
        a = argv[i]
        if a == "--":
            after = True
        elif after:
            flags.append(a)
        elif a in ("--workload", "--ab", "--labels", "--seed"):
            flags += [a, argv[i + 1]]
            i += 1
        elif a in ("--out", "--time-scale", "--workers"):
            i += 1
        i += 1
    return flags


def run_virtual(kvr, flags, workload, scale, out, seed, params):
    cmd = [kvr, "bench", "--virtual"] + flags + [a for p in params for a in ("--policy-params", p)] + [
        "--seed", str(seed), "--scrape-interval-ms", str(int(100 * scale)),
        "--scrape-stale-ms", str(int(5000 * scale)), "--out", out, "--quiet"]
    if workload == "multiturn":
        cmd += ["--multiturn-mode", "session"]  # what the demo passes for multiturn
    t0 = time.time()
    res = subprocess.run(cmd, check=True, capture_output=True, text=True)
    got = {}
    for line in res.stdout.splitlines():
        m = re.match(r"\s+(\S+)\s+([0-9.]+) RPS", line)
        if m:
            got[m.group(1)] = float(m.group(2))
    return got, time.time() - t0, cmd


def pct(a, b):
    if a == b:
        return 0.0  # both 0 included: no SLO-compliant rate either way
    return (a - b) / b * 100 if b else float("inf")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvrouter")
    ap.add_argument("out")
    ap.add_argument("md")
    ap.add_argument("raw", nargs="+")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--params", action="append", default=[])
    a = ap.parse_args()
    wdirs = []
    for r in a.raw:
        if os.path.exists(os.path.join(r, "stamp")):
            wdirs.append(r)
        else:
            wdirs += sorted(d for d in glob.glob(os.path.join(r, "*"))
                            if os.path.exists(os.path.join(d, "stamp")))
    rows, lvl_rows, cmds = [], [], []
    within = total = 0
    for wdir in wdirs:
        st = stamp(os.path.join(wdir, "stamp"))
        w = st["workload"]
        tag = os.path.basename(os.path.dirname(os.path.abspath(wdir))) + "-" + w
        real = rates(wdir)
        scale = float(st["time_scale"])
        flags = bench_flags(st)
        seed = 42
        if "--seed" in flags:
            seed = int(flags[flags.index("--seed") + 1])
            del flags[flags.index("--seed"):flags.index("--seed") + 2]
        virt, secs, cmd = run_virtual(a.kvrouter, flags, w, scale, os.path.join(a.out, tag), seed,
                                      a.params)
        cmds.append((w, st.get("demo_cmd", st.get("cmd")), st.get("commit", "?"),
                     " ".join(shlex.quote(c) for c in cmd)))
        means = {}
        for k in range(1, a.seeds):
            v, _, _ = run_virtual(a.kvrouter, flags, w, scale,
                                  os.path.join(a.out, f"{tag}-seed{seed + k}"), seed + k, a.params)
            for lab, x in v.items():
                means.setdefault(lab, []).append(x)
        for lab, x in real.items():
            y = virt.get(lab)
            ms = [y] + means.get(lab, []) if y is not None else []
            mean = sum(ms) / len(ms) if ms else float("nan")
            d = pct(y, x) if y is not None else float("nan")
            ok = abs(d) <= 7 if d == d else False
            within += ok
            total += 1
            rows.append(f"| {w} | {lab} | {x:.3f} | {y:.3f} | {d:+.1f}% | {'yes' if ok else 'no'} | "
                        f"{mean:.3f} ({len(ms)} seeds) |")
        rl = levels(os.path.join(wdir, "results"))
        vl = levels(os.path.join(a.out, tag, "results"))
        for key in sorted(set(rl) & set(vl)):
            (rt, rp), (vt, vp) = rl[key], vl[key]
            if not (rt and vt and rp and vp):
                continue  # a level stopped early (TTFT certain to miss) has no p99s
            lvl_rows.append(f"| {w} | {key[0]} | {key[1]:.3f} | {rt:.0f} | {vt:.0f} | {pct(vt, rt):+.1f}% "
                            f"| {rp:.1f} | {vp:.1f} | {pct(vp, rp):+.1f}% |")
        print(f"{w}: virtual in {secs:.1f} s", file=sys.stderr)
    md = [first_line(), "", "# Virtual time against the real-time A/B", "",
          "Generated by bench/scripts/agreement/agreement.py (see its header). The real column is",
          "the A/B of `bench/scripts/ab/ab.sh` kept in the raw folder given; the virtual column",
          "reruns the same bench flags and seed in virtual time, with the scrape interval and",
          "staleness the real router had at that time scale (100 ms and 5 s real). The issue's",
          "bar: each policy's virtual max SLO-compliant rate within 7% of the real one.", "",
          f"**{within} of {total} within 7%.**", "",
          "| workload | label | real (req/s) | virtual, same seed | difference | within 7% | virtual mean |",
          "|---|---|---:|---:|---:|:-:|---:|"] + rows + [
          "", "## Levels both runs measured (same seed, same rate: the same requests)", "",
          "| workload | label | rate | TTFT p99 real | virtual | diff | TPOT p99 real | virtual | diff |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|"] + lvl_rows + ["", "## Commands", ""]
    for w, real_cmd, commit, vcmd in cmds:
        md += [f"- {w}, real (at {commit}): `{real_cmd}`", f"- {w}, virtual: `{vcmd}`"]
    with open(a.md, "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    sys.exit(main())
