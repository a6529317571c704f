#!/usr/bin/env python3
"""`kvrouter serve --trace-out` end to end (issue 34, capture): a real router in front of a real
`kvrouter sim` writes every completed request as a Mooncake-format trace line, with the usage
figures, ids shared exactly as far as the prompts share leading blocks, and no text; the file
rotates at its size bound; an unwritable file stops the start with a one-line error.

Run:  python3 tests/router/test_trace_capture.py --kvrouter build/kvrouter [-k substring] [-v]
"""
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import FAST, MODEL, Cleanup, Router, Sim, request, wait_for  # noqa: E402

TESTS, test = h.registry()



def doc(n):
    return "".join("Paragraph %d of the shared handbook on cache-aware routing. " % i
                   for i in range(n))


def chat(system, user, stream=False):
    b = {"model": MODEL, "max_tokens": 6, "ignore_eos": True,
         "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
    if stream:
        b["stream"] = True
        b["stream_options"] = {"include_usage": True}
    return b


def read_trace(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


@test(timeout=40)
def test_capture_lines_sharing_and_no_text():
    """Three requests over one long document and a fourth unrelated one: the first three share
    every id of the document's trace blocks, their own questions end in ids of their own; usage
    figures are the sim's; no byte of the prompts is in the file."""
    with Cleanup() as c, tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "live.jsonl")
        sim = c.add(Sim(fixed=(2, 1)))
        r = c.add(Router([sim], *FAST, "--trace-out", path, "--trace-block-tokens", "64"))
        system = doc(60)  # ~3,700 bytes: 14 trace blocks of 64 tokens
        for q in ("What is section one about?", "Summarise section two.", "And section three?"):
            assert request(r.port, "POST", "/v1/chat/completions", chat(system, q)).status == 200
        x = request(r.port, "POST", "/v1/chat/completions",
                    chat("A different system prompt entirely, unrelated to the handbook.",
                         "hello", stream=True))
        assert x.status == 200
        wait_for(lambda: h.prom_value(h.parse_prom_samples(r.metrics_text()),
                                      "kvrouter_trace_lines_total") == 4, 5, "4 trace lines")
        r.stop()  # flushes at exit
        lines = read_trace(path)
        assert len(lines) == 4, lines
        for ln in lines:
            assert set(ln) == {"timestamp", "input_length", "output_length", "hash_ids",
                               "tokens_source"}, ln
            assert ln["tokens_source"] == "usage", ln
            assert ln["output_length"] == 6, ln
            assert len(ln["hash_ids"]) == -(-ln["input_length"] // 64), ln
        a, b, c3, d = lines
        assert a["timestamp"] <= b["timestamp"] <= c3["timestamp"] <= d["timestamp"]
        shared = 0
        while a["hash_ids"][shared] == b["hash_ids"][shared]:
            shared += 1
        assert shared >= 10, (a["hash_ids"], b["hash_ids"])  # the document's blocks
        assert a["hash_ids"][:shared] == c3["hash_ids"][:shared]
        assert a["hash_ids"][-1] != b["hash_ids"][-1] != c3["hash_ids"][-1]
        assert not set(d["hash_ids"]) & set(a["hash_ids"] + b["hash_ids"]), d
        assert a["hash_ids"][0] == 0  # renumbered from 0 in first-seen order
        text = open(path).read()
        for word in ("handbook", "Paragraph", "section", "hello", "system"):
            assert word not in text, word


@test(timeout=40)
def test_rotation_and_unwritable_file():
    """Past --trace-out-max-bytes the file becomes FILE.1 and a new FILE starts with ids from 0;
    a file that cannot be created is a one-line error and exit 2."""
    with Cleanup() as c, tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "live.jsonl")
        sim = c.add(Sim(fixed=(2, 1)))
        r = c.add(Router([sim], *FAST, "--trace-out", path, "--trace-out-max-bytes", "300"))
        for i in range(6):
            body = chat(doc(5 + i), "question %d" % i)
            assert request(r.port, "POST", "/v1/chat/completions", body).status == 200
        r.stop()
        old, new = read_trace(path + ".1"), read_trace(path)
        assert len(old) + len(new) <= 6 and len(old) >= 1 and len(new) >= 1, (old, new)
        assert new[0]["hash_ids"][0] == 0, new
        assert os.path.getsize(path + ".1") >= 300
    p = subprocess.run([h._kvrouter(), "serve", "--worker", "http://127.0.0.1:9",
                        "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                        "--trace-out", "/nonexistent-dir/live.jsonl"],
                       capture_output=True, text=True, timeout=10)
    assert p.returncode == 2, (p.returncode, p.stderr)
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "/nonexistent-dir/live.jsonl" in err[0], p.stderr


if __name__ == "__main__":
    h.run(TESTS)
