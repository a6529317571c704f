#!/usr/bin/env python3
"""tokenize_cost.py -- what precise mode's POST /tokenize adds before a routing decision.

Experiment precise (bench/results/precise/): prints its two figures per mode; writes no file (the
top-level README quotes them).

One `kvrouter sim` publishing KV events (ipc:// sockets in a temporary folder) and one `kvrouter
serve` in front of it, first in precise mode (the worker's kv_events endpoints; the tokenize cache
off, so every prompt is tokenized), then approximate (the plain URL). Each mode sends N distinct
~1,600-token chat prompts (max_tokens 1) and reads the router's /metrics: the mean of
kvrouter_tokenize_duration_seconds and of kvrouter_time_to_first_byte_seconds.

    python3 bench/scripts/precise/tokenize_cost.py --kvrouter build/kvrouter [--prompts 60]

Loopback only; processes stopped by PID (tests/harness/kvrharness.py).
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "tests", "harness"))
import kvrharness as h  # noqa: E402


def mean(m, name):
    n = h.prom_value(m, name + "_count")
    return h.prom_value(m, name + "_sum") / n if n else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvrouter", required=True)
    ap.add_argument("--prompts", type=int, default=60)
    args = ap.parse_args()
    h.set_kvrouter(args.kvrouter)
    d = tempfile.mkdtemp(prefix="kvr-tokcost-")
    ev, rp = "ipc://%s/ev" % d, "ipc://%s/rp" % d
    try:
        with h.Cleanup() as c:
            s = c.add(h.Sim("--time-scale", 20, "--kv-events-config", json.dumps(
                {"enable_kv_cache_events": True, "endpoint": ev, "replay_endpoint": rp}),
                fixed=None))
            for mode, spec in (("precise", "%s,kv_events=%s,kv_replay=%s" % (s.url, ev, rp)),
                               ("approximate", s.url)):
                r = c.add(h.Router([spec], "--tokenize-cache-entries", 0))
                if mode == "precise":
                    h.wait_for(lambda: r.workers()[0]["kv_events"]["index"] == "precise", 10,
                               "precise mode")
                for i in range(args.prompts):
                    body = {"model": h.MODEL, "max_tokens": 1, "messages": [
                        {"role": "user", "content": ("prompt %d %s " % (i, mode)) +
                         "lorem ipsum dolor sit amet " * 250}]}
                    resp = h.request(r.port, "POST", "/v1/chat/completions", body, timeout=30)
                    assert resp.status == 200, resp.status
                m = h.parse_prom_samples(r.metrics_text())
                tok = mean(m, "kvrouter_tokenize_duration_seconds")
                print("%-12s tokenize mean %s, time to first byte mean %.2f ms (%d prompts)" % (
                    mode, "%.2f ms" % (tok * 1e3) if tok is not None else "-",
                    mean(m, "kvrouter_time_to_first_byte_seconds") * 1e3, args.prompts))
                r.stop()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
