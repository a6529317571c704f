#!/usr/bin/env python3
"""`kvrouter sim` as the workers of a real fleet are started (issue 35): the real binary on
127.0.0.1, driven as a client of vLLM drives it.

--served-model-name NAME [NAME ...]: every alias a base card of GET /v1/models (root --model,
parent null, max_model_len), requests may name any alias (the --model path then is not a name),
replies and the metrics' model_name carry the first name; a bad command line is one line, exit 2.

    python3 tests/bench/sim/test_sim_fleet.py --kvrouter build/kvrouter [-k NAME] [-v]
"""

import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import Sim  # noqa: E402

TESTS, test = h.registry()
ROOT = "/models/Llama-3.1-8B-Instruct"


def chat(model, **extra):
    body = {"messages": [{"role": "user", "content": "Hello there, how are you?"}],
            "max_tokens": 3}
    if model is not None:
        body["model"] = model
    body.update(extra)
    return body


def not_found(name):
    return {"error": {"message": "The model `%s` does not exist." % name, "type": "NotFoundError",
                      "param": "model", "code": 404}}


def cli(*flags, timeout=10):
    """Runs `kvrouter sim FLAGS` that must stop at its command line: (exit status, stderr)."""
    p = subprocess.run([h._kvrouter(), "sim"] + list(flags), capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stderr


@test(timeout=30)
def test_served_model_names():
    with Sim("--model", ROOT, "--served-model-name", "llama-8b", "chat-small", fixed=None,
             admin=False) as s:
        cards = s.request("GET", "/v1/models").json()["data"]
        assert [c["id"] for c in cards] == ["llama-8b", "chat-small"], cards
        for c in cards:
            assert c["root"] == ROOT and c["parent"] is None and c["object"] == "model", c
            assert c["max_model_len"] == 131072 and c["owned_by"] == "vllm", c
        for name in ("llama-8b", "chat-small", None):
            st, body = s.post_json("/v1/chat/completions", chat(name))
            assert st == 200 and body["model"] == "llama-8b", (name, st, body)
            st, body = s.post_json("/v1/completions", {"model": name, "prompt": "hi",
                                                       "max_tokens": 2})
            assert st == 200 and body["model"] == "llama-8b", (name, st, body)
        st, body = s.post_json("/v1/chat/completions", chat(ROOT))
        assert st == 404 and body == not_found(ROOT), (st, body)
        st, body = s.post_json("/v1/chat/completions", chat("other"))
        assert st == 404 and body == not_found("other"), (st, body)
        m = s.metrics()
        assert h.prom_value(m, "vllm:request_success_total", model_name="llama-8b") == 6, m
        assert all(dict(ls).get("model_name") in (None, "llama-8b") for (_, ls) in m), m
        # the streamed chunks carry the first name too
        r = s.request("POST", "/v1/chat/completions", chat("chat-small", stream=True))
        assert r.status == 200 and '"model":"llama-8b"' in r.text(), r.text()[:300]
        assert '"model":"chat-small"' not in r.text()


@test(timeout=20)
def test_served_model_name_default_and_flags():
    with Sim("--model", ROOT, fixed=None, admin=False) as s:
        cards = s.request("GET", "/v1/models").json()["data"]
        assert [(c["id"], c["root"]) for c in cards] == [(ROOT, ROOT)], cards
    # the flag's value list ends at the next flag; the last occurrence's list wins (argparse)
    with Sim("--served-model-name", "a", "b", "--model", ROOT, "--served-model-name", "c",
             fixed=None, admin=False) as s:
        cards = s.request("GET", "/v1/models").json()["data"]
        assert [c["id"] for c in cards] == ["c"], cards
    rc, err = cli("--served-model-name")
    assert rc == 2 and "served-model-name" in err and len(err.strip().splitlines()) == 1, err
    rc, err = cli("--served-model-name", "")
    assert rc == 2 and "--served-model-name: a name must not be empty" in err, err


if __name__ == "__main__":
    sys.exit(h.run(TESTS, description=__doc__))
