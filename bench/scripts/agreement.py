#!/usr/bin/env python3
"""agreement.py -- how well `kvrouter bench --virtual` agrees with the real-time A/B.

The real-time A/B (bench/scripts/ab.sh) keeps, per workload, its stamp (time scale, the demo
command and its bench flags) and each label's max SLO-compliant rate in AB_RAW/<workload>/, and the
per-level JSON in AB_RAW/<workload>/results/. This script reruns every workload in virtual time
with the same bench flags and the same seed -- so the same request traces -- and the delays the
real run had at its time scale: `kvrouter serve` scrapes every 1 s and ignores figures older than
5 s of real time, which at time scale S are S and 5 S simulated seconds. It then writes AGREEMENT.md:
per workload and policy the real and the virtual max SLO-compliant rate and their difference (the
issue's bar: within 7%), the mean over three seeds in virtual time, and, for every (label, rate)
level both runs measured, TTFT p99 and TPOT p99 side by side.

usage: bench/scripts/agreement.py KVROUTER AB_RAW OUT AGREEMENT_MD [--seeds N]
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


def stamp(path):
    out = {}
    with open(path) as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition("=")
            out[k] = v
    return out


def rates(path):
    out = {}
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) == 2:
                out[p[0]] = float(p[1])
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


def bench_flags(demo_cmd):
    """The bench flags of the demo command: the workload, policies, labels, seed and the flags
    after --."""
    argv = shlex.split(demo_cmd)
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


def run_virtual(kvr, flags, workload, scale, out, seed):
    cmd = [kvr, "bench", "--virtual"] + flags + [
        "--seed", str(seed), "--scrape-interval-ms", str(int(1000 * scale)),
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
    ap.add_argument("ab_raw")
    ap.add_argument("out")
    ap.add_argument("md")
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    rows, lvl_rows, cmds = [], [], []
    within = total = 0
    for wdir in sorted(glob.glob(os.path.join(a.ab_raw, "*"))):
        w = os.path.basename(wdir)
        if not os.path.exists(os.path.join(wdir, "stamp")):
            continue
        st = stamp(os.path.join(wdir, "stamp"))
        real = rates(os.path.join(wdir, "rates"))
        scale = float(st["time_scale"])
        flags = bench_flags(st["demo_cmd"])
        seed = 42
        if "--seed" in flags:
            seed = int(flags[flags.index("--seed") + 1])
            del flags[flags.index("--seed"):flags.index("--seed") + 2]
        virt, secs, cmd = run_virtual(a.kvrouter, flags, w, scale, os.path.join(a.out, w), seed)
        cmds.append((w, st["demo_cmd"], st.get("commit", "?"), " ".join(shlex.quote(c) for c in cmd)))
        means = {}
        for k in range(1, a.seeds):
            v, _, _ = run_virtual(a.kvrouter, flags, w, scale, os.path.join(a.out, f"{w}-seed{seed + k}"),
                                  seed + k)
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
        vl = levels(os.path.join(a.out, w, "results"))
        for key in sorted(set(rl) & set(vl)):
            (rt, rp), (vt, vp) = rl[key], vl[key]
            if not (rt and vt and rp and vp):
                continue  # a level stopped early (TTFT certain to miss) has no p99s
            lvl_rows.append(f"| {w} | {key[0]} | {key[1]:.3f} | {rt:.0f} | {vt:.0f} | {pct(vt, rt):+.1f}% "
                            f"| {rp:.1f} | {vp:.1f} | {pct(vp, rp):+.1f}% |")
        print(f"{w}: virtual in {secs:.1f} s", file=sys.stderr)
    md = ["# Virtual time against the real-time A/B", "",
          "Generated by `bench/scripts/agreement.py` (see its header). The real column is the A/B of",
          "`bench/scripts/ab.sh` kept in the raw folder given; the virtual column reruns the same",
          "bench flags and seed in virtual time, with the scrape interval and staleness the real",
          "router had at that time scale. The issue's bar: each policy's virtual max SLO-compliant",
          "rate within 7% of the real one.", "",
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
