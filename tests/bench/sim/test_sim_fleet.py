#!/usr/bin/env python3
"""`kvrouter sim` as the workers of a real fleet are started (issue 35): the real binary on
127.0.0.1, driven as a client of vLLM drives it.

--served-model-name NAME [NAME ...]: every alias a base card of GET /v1/models (root --model,
parent null, max_model_len), requests may name any alias (the --model path then is not a name),
replies and the metrics' model_name carry the first name; a bad command line is one line, exit 2.

LoRA: --enable-lora, --lora-modules (name=path and JSON items), --max-loras, --max-cpu-loras,
--max-lora-rank; adapters as cards (root the path, parent the base name, max_model_len null), a
request naming one answered under its name, its blocks apart from the base model's (cached
tokens), vllm:lora_requests_info only with LoRA, POST /v1/load_lora_adapter and
/v1/unload_lora_adapter with every status and body vLLM gives, and absent (404) without
VLLM_ALLOW_RUNTIME_LORA_UPDATING. An adapter is a folder holding adapter_config.json (its "r").

Data parallel: --data-parallel-size / -dp N with --api-server-count / -asc: X-data-parallel-rank
pins chat, completions and Messages (not Responses), an out-of-range rank is vLLM's 400 (the
Anthropic shape on /v1/messages), unpinned requests go to the lowest waiting*4+running, every
per-engine family carries engine="R" and model_name (cache_config_info one sample per engine),
/reset_prefix_cache reaches every engine, and each engine publishes its KV events on the base
port + rank with the rank as the batch's third element (python3-zmq and python3-msgpack; that
part is skipped without them).

    python3 tests/bench/sim/test_sim_fleet.py --kvrouter build/kvrouter [-k NAME] [-v]
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import Sim  # noqa: E402

TESTS, test = h.registry()
ROOT = "/models/Llama-3.1-8B-Instruct"
ROOT_DEFAULT = "meta-llama/Llama-3.3-70B-Instruct"  # kvrouter sim's --model


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


def adapter(folder, name, rank=8):
    """A PEFT adapter folder (adapter_config.json with its rank); returns its path."""
    path = os.path.join(folder, name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"r": rank, "lora_alpha": 16, "peft_type": "LORA",
                   "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}, f)
    return path


def error(status, type_, message, param=None):
    return {"error": {"message": message, "type": type_, "param": param, "code": status}}


def lora_series(m):
    """vllm:lora_requests_info's series: [(labels dict, value)]."""
    return [(dict(ls), v) for (n, ls), v in m.items() if n == "vllm:lora_requests_info"]


@test(timeout=40)
def test_lora_static_adapters():
    with tempfile.TemporaryDirectory() as d:
        sql, fr = adapter(d, "sql"), adapter(d, "fr", rank=16)
        with Sim("--model", ROOT, "--served-model-name", "llama", "--enable-lora",
                 "--lora-modules", "sql-lora=" + sql,
                 json.dumps({"name": "fr-lora", "path": fr, "base_model_name": "llama"}),
                 "--max-loras", "2", fixed=None, admin=False) as s:
            cards = s.request("GET", "/v1/models").json()["data"]
            assert [(c["id"], c["root"], c["parent"], c["max_model_len"]) for c in cards] == [
                ("llama", ROOT, None, 131072), ("sql-lora", sql, "llama", None),
                ("fr-lora", fr, "llama", None)], cards
            m = s.metrics()
            assert lora_series(m) == [], m  # the family, no series before a step
            assert "# TYPE vllm:lora_requests_info gauge" in s.request("GET", "/metrics").text()
            prompt = "a shared prompt long enough to fill several blocks of sixteen tokens " * 4
            body = lambda model: {"model": model, "prompt": prompt, "max_tokens": 3}
            cached = []
            for model in ("llama", "sql-lora", "sql-lora", "fr-lora", "llama"):
                st, r = s.post_json("/v1/completions", body(model))
                assert st == 200 and r["model"] == model, (model, st, r)
                cached.append(r["usage"]["prompt_tokens_details"]["cached_tokens"])
            # an adapter's blocks are its own: no hit across the base model and the adapters
            assert cached[0] == 0 and cached[1] == 0 and cached[2] > 0 and cached[3] == 0, cached
            assert cached[4] == cached[2], cached
            st, r = s.post_json("/v1/chat/completions", chat("nope-lora"))
            assert st == 404 and r == not_found("nope-lora"), r
            series = lora_series(s.metrics())
            now = time.time()
            assert series and all(ls["max_lora"] == "2" for ls, _ in series), series
            assert all(now - 120 < v <= now + 1 for _, v in series), (now, series)
            running = {ls["running_lora_adapters"] for ls, _ in series}
            assert "sql-lora" in running and "fr-lora" in running, series
            # the runtime routes do not exist without VLLM_ALLOW_RUNTIME_LORA_UPDATING
            for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
                r = s.request("POST", path, {"lora_name": "x", "lora_path": sql})
                assert r.status == 404 and r.json() == {"detail": "Not Found"}, (path, r)
    # without --enable-lora: no gauge
    with Sim(fixed=None, admin=False) as s:
        assert "lora_requests_info" not in s.request("GET", "/metrics").text()


@test(timeout=40)
def test_lora_runtime_updating():
    with tempfile.TemporaryDirectory() as d:
        a, big = adapter(d, "a"), adapter(d, "big", rank=64)
        env = dict(os.environ, VLLM_ALLOW_RUNTIME_LORA_UPDATING="True")
        with Sim("--enable-lora", "--served-model-name", "base", fixed=None, admin=False,
                 env=env) as s:
            load = lambda body: s.request("POST", "/v1/load_lora_adapter", body)
            r = load({"lora_name": "a", "lora_path": a})
            assert r.status == 200 and r.text() == "Success: LoRA adapter 'a' added successfully.", r
            cards = s.request("GET", "/v1/models").json()["data"]
            assert [(c["id"], c["root"], c["parent"]) for c in cards] == [
                ("base", ROOT_DEFAULT, None), ("a", a, "base")], cards
            st, body = s.post_json("/v1/chat/completions", chat("a"))
            assert st == 200 and body["model"] == "a", body
            r = load({"lora_name": "a", "lora_path": a})
            assert r.status == 400 and r.json() == error(
                400, "InvalidUserInput", "The lora adapter 'a' has already been loaded. If you "
                "want to load the adapter in place, set 'load_inplace' to True."), r.json()
            r = load({"lora_name": "a", "lora_path": a, "load_inplace": True})
            assert r.status == 200, r
            r = load({"lora_name": "", "lora_path": a})
            assert r.status == 400 and r.json() == error(
                400, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided."), r
            missing = os.path.join(d, "missing")
            r = load({"lora_name": "m", "lora_path": missing})
            assert r.status == 404 and r.json() == error(
                404, "NotFoundError",
                "Loading lora m failed: No adapter found for %s" % missing), r.json()
            r = load({"lora_name": "big", "lora_path": big})
            assert r.status == 500 and r.json() == error(
                500, "InternalServerError", "LoRA rank 64 is greater than max_lora_rank 16."), r
            r = load({"lora_path": a})
            assert r.status == 400 and r.json()["error"]["type"] == "Bad Request", r.json()
            assert r.json()["error"]["param"] == "body.lora_name", r.json()
            # validate_json_request: another Content-Type is 400 before the body is read
            r = s.request("POST", "/v1/load_lora_adapter", b'{"lora_name":"z","lora_path":"/x"}',
                          headers=[("Content-Type", "text/plain")])
            assert r.status == 400 and "Unsupported Media Type" in r.json()["error"]["message"], r
            r = s.request("GET", "/v1/load_lora_adapter")
            assert r.status == 405 and r.json() == {"detail": "Method Not Allowed"}, r
            unload = lambda body: s.request("POST", "/v1/unload_lora_adapter", body)
            r = unload({"lora_name": "a"})
            assert r.status == 200 and r.text() == \
                "Success: LoRA adapter 'a' removed successfully.", r
            r = unload({"lora_name": "a"})
            assert r.status == 404 and r.json() == error(
                404, "NotFoundError", "The lora adapter 'a' cannot be found."), r.json()
            r = unload({"lora_name": ""})
            assert r.status == 400 and r.json() == error(
                400, "InvalidUserInput",
                "'lora_name' needs to be provided to unload a LoRA adapter."), r.json()
            st, body = s.post_json("/v1/chat/completions", chat("a"))
            assert st == 404 and body == not_found("a"), body
            assert [c["id"] for c in s.request("GET", "/v1/models").json()["data"]] == ["base"]
    # with the routes but without --enable-lora, a load is the engine's 500
    env = dict(os.environ, VLLM_ALLOW_RUNTIME_LORA_UPDATING="1")
    with Sim(fixed=None, admin=False, env=env) as s:
        r = s.request("POST", "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/x"})
        assert r.status == 500 and r.json()["error"]["type"] == "InternalServerError", r


@test(timeout=30)
def test_lora_flags():
    with tempfile.TemporaryDirectory() as d:
        a = adapter(d, "a")
        cases = [
            (["--max-loras", "2", "--max-cpu-loras", "1", "--enable-lora"],
             "--max-cpu-loras: max_cpu_loras (1) must be >= max_loras (2)"),
            (["--max-lora-rank", "7"], "--max-lora-rank: 7 is not one of 1, 8, 16"),
            (["--lora-modules", "a=" + a], "--lora-modules: needs --enable-lora"),
            (["--enable-lora", "--lora-modules", "{bad"],
             "--lora-modules: Invalid JSON format for --lora-modules: {bad"),
            (["--enable-lora", "--lora-modules", '{"name":"x"}'], "--lora-modules: Invalid fields"),
            (["--enable-lora", "--lora-modules", "x=" + os.path.join(d, "none")],
             "lora-modules: Loading lora x failed: No adapter found for"),
            (["--max-loras", "0"], "--max-loras"),
        ]
        for flags, want in cases:
            rc, err = cli(*flags)
            assert rc == 2 and want in err and len(err.strip().splitlines()) == 1, (flags, rc, err)
        # defaults: max_loras 1, max_cpu_loras = max_loras; a later --lora-modules replaces
        with Sim("--enable-lora", "--lora-modules", "x=" + a, "--lora-modules", "y=" + a,
                 "z=" + a, "--max-lora-rank", "8", fixed=None, admin=False) as s:
            cards = s.request("GET", "/v1/models").json()["data"]
            assert [c["id"] for c in cards] == [ROOT_DEFAULT, "y", "z"], cards
            st, body = s.post_json("/v1/completions", {"model": "z", "prompt": "hi",
                                                       "max_tokens": 2})
            assert st == 200
            series = lora_series(s.metrics())
            assert series and {ls["max_lora"] for ls, _ in series} == {"1"}, series
    out = subprocess.run([h._kvrouter(), "sim", "--help"], capture_output=True, text=True).stdout
    for flag in ("--enable-lora", "--lora-modules", "--max-loras", "--max-cpu-loras",
                 "--max-lora-rank"):
        assert flag in out, flag


def completion(s, prompt, rank=None, max_tokens=2, path="/v1/completions", **extra):
    body = {"prompt": prompt, "max_tokens": max_tokens}
    if path == "/v1/chat/completions":
        body = chat(None, max_tokens=max_tokens)
        body["messages"][0]["content"] = prompt
    body.update(extra)
    headers = [("X-Data-Parallel-Rank", str(rank))] if rank is not None else None
    return s.request("POST", path, body, headers=headers)


def per_engine(m, name, **labels):
    """{engine: value} of the samples of name with labels."""
    want = set(labels.items())
    return {dict(ls)["engine"]: v for (n, ls), v in m.items() if n == name and want <= set(ls)}


@test(timeout=60)
def test_dp_pinning_and_labels():
    with Sim("--model", ROOT, "--served-model-name", "llama", "-dp", "3", "-asc", "1",
             fixed=None, admin=False) as s:
        for rank, path in ((0, "/v1/completions"), (2, "/v1/completions"),
                           (2, "/v1/chat/completions"), (1, "/v1/chat/completions")):
            r = completion(s, "pinned to %d" % rank, rank, path=path)
            assert r.status == 200, r
        r = s.request("POST", "/v1/messages", {"model": "llama", "max_tokens": 2, "messages": [
            {"role": "user", "content": "hi"}]}, headers=[("x-data-parallel-rank", "1")])
        assert r.status == 200, r
        m = s.metrics()
        done = per_engine(m, "vllm:request_success_total", finished_reason="length")
        assert done == {"0": 1, "1": 2, "2": 2}, done
        # every per-engine family has one sample per engine with engine and model_name
        for fam in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                    "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                    "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
                    "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                    "vllm:time_to_first_token_seconds_count",
                    "vllm:inter_token_latency_seconds_count",
                    "vllm:e2e_request_latency_seconds_count"):
            got = per_engine(m, fam, model_name="llama")
            assert sorted(got) == ["0", "1", "2"], (fam, got)
        ttft = per_engine(m, "vllm:time_to_first_token_seconds_count")
        assert ttft == {"0": 1, "1": 2, "2": 2}, ttft
        info = [dict(ls) for (n, ls), _ in m.items() if n == "vllm:cache_config_info"]
        assert sorted(i["engine"] for i in info) == ["0", "1", "2"], info
        assert all("model_name" not in i for i in info), info
        # out of range: vLLM's ValueError, answered 400 BadRequestError
        for bad in ("3", "-1", "99"):
            r = completion(s, "x", bad)
            assert r.status == 400 and r.json() == error(
                400, "BadRequestError",
                "data_parallel_rank %s is out of range [0, 3)." % bad), r.json()
        r = s.request("POST", "/v1/messages", {"model": "llama", "max_tokens": 2, "messages": [
            {"role": "user", "content": "hi"}]}, headers=[("X-Data-Parallel-Rank", "3")])
        assert r.status == 400 and r.json() == {"type": "error", "error": {
            "type": "BadRequestError",
            "message": "data_parallel_rank 3 is out of range [0, 3)."}}, r.json()
        # a value int() cannot read is ignored; Responses does not read the header
        assert completion(s, "x", "one").status == 200
        r = s.request("POST", "/v1/responses", {"model": "llama", "input": "hi",
                                                "max_output_tokens": 2},
                      headers=[("X-Data-Parallel-Rank", "7")])
        assert r.status == 200, r
    rc, err = cli("-dp", "0")
    assert rc == 2 and "--data-parallel-size" in err, err
    with Sim("-dp=2", "-asc=1", fixed=None, admin=False) as s:  # argparse's -dp=N spelling
        m = s.metrics()
        assert sorted(per_engine(m, "vllm:num_requests_running")) == ["0", "1"], m
    rc, err = cli("--data-parallel-size", "65")
    assert rc == 2 and "--data-parallel-size" in err, err


@test(timeout=60)
def test_dp_balance_and_reset():
    # time scale 1: the engines' steps take real milliseconds, so requests overlap
    with Sim("--data-parallel-size", "2", fixed=None, admin=False) as s:
        # unpinned requests sent together: the second sees the first counted as waiting on
        # engine 0 and goes to engine 1 (waiting*4 + running, bumped per request)
        import threading
        results = []
        def send(i):
            results.append(completion(s, "balance %d" % i, None, max_tokens=20).status)
        threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [200] * 4, results
        done = per_engine(s.metrics(), "vllm:request_success_total", finished_reason="length")
        assert done == {"0": 2, "1": 2}, done
        # the same prompt on each engine: cached the second time; a reset empties both caches
        prompt = "a prompt that fills more than two blocks of sixteen tokens each " * 3
        def cached(rank):
            r = completion(s, prompt, rank)
            assert r.status == 200, r
            return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached(0) == 0 and cached(1) == 0
        assert cached(0) > 0 and cached(1) > 0
        r = s.request("POST", "/reset_prefix_cache")
        assert r.status == 200, r
        assert cached(0) == 0 and cached(1) == 0


def free_port_pair():
    """A port P with P and P+1 free on 127.0.0.1."""
    for _ in range(50):
        a = socket.socket()
        a.bind(("127.0.0.1", 0))
        p = a.getsockname()[1]
        b = socket.socket()
        try:
            b.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
        finally:
            a.close()
            b.close()
    raise AssertionError("no two adjacent free ports")


@test(timeout=60)
def test_dp_kv_events_per_rank():
    try:
        sys.path.append("/usr/lib/python3/dist-packages")
        import msgpack
        import zmq
    except ImportError:
        print("  (skipped: python3-zmq and python3-msgpack are needed)")
        return
    port = free_port_pair()
    ctx = zmq.Context()
    subs = []
    try:
        for r in range(2):
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.setsockopt(zmq.LINGER, 0)
            sub.bind("tcp://127.0.0.1:%d" % (port + r))  # the sim connects (vLLM's rule)
            subs.append(sub)
        cfg = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                          "endpoint": "tcp://127.0.0.1:%d" % port, "topic": "kv"})
        with Sim("-dp", "2", "--kv-events-config", cfg, fixed=None, admin=False) as s:
            # the PUBs connect; ZMQ runs the SUB's subscription only inside calls on it, so
            # poll (nothing arrives yet) rather than sleep
            for sub in subs:
                assert not sub.poll(300), "events before any request"
            for rank in (1, 0, 1):
                words = " ".join("r%d_%d_%d" % (rank, time.time_ns() % 1000, i)
                                 for i in range(40))
                assert completion(s, words, rank).status == 200
            got = []
            for r, sub in enumerate(subs):
                while sub.poll(1500):
                    topic, seq, payload = sub.recv_multipart()
                    batch = msgpack.unpackb(payload, raw=False)
                    assert len(batch) == 3 and batch[2] == r, (r, batch[2])
                    got.append((r, struct_u64(seq)))
            ranks = [r for r, _ in got]
            assert ranks.count(0) >= 1 and ranks.count(1) >= 2, got
            # each publisher counts its own sequence from 0
            assert [q for r, q in got if r == 1][:2] == [0, 1], got
    finally:
        for sub in subs:
            sub.close()
        ctx.term()


def struct_u64(b):
    return int.from_bytes(b, "big")


if __name__ == "__main__":
    sys.exit(h.run(TESTS, description=__doc__))
