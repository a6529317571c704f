#!/usr/bin/env python3
"""walkthrough.py -- a fleet of two models with LoRA adapters and a data-parallel server behind one
kvrouter, shown request by request (issue 35), into OUT/REPORT.md.

The fleet, all `kvrouter sim` on 127.0.0.1 (each a vLLM stand-in with vLLM's flags):
  llama   --model meta-llama/Llama-3.1-8B-Instruct --served-model-name llama-8b llama
          -dp 2 (one API server, two data-parallel engines: two router workers, one per rank)
  qwen-1  --model Qwen/Qwen3-32B --served-model-name qwen --enable-lora
          --lora-modules sql=... chat=... --max-loras 2 (two adapters listed at start)
  qwen-2  the same base with only sql listed, VLLM_ALLOW_RUNTIME_LORA_UPDATING=1
and `kvrouter serve` in front with `--lora-adapter summ=...` (an adapter the router may load at
runtime on a worker serving its base). Then, through the router: GET /v1/models (the union),
requests for every name (where each lands: x-kvrouter-worker), an adapter no worker lists loaded
once on a worker of its base, an unknown model's 404, and the `model` label on /metrics.

Every process is started here and stopped by its PID. Loopback only; about 15 s.

Run:  python3 bench/scripts/fleet/walkthrough.py --kvrouter build/kvrouter --out bench/results/fleet
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from provenance import first_line  # noqa: E402

LISTEN = re.compile(r"listening on (?:http://)?127\.0\.0\.1:(\d+)")
PORTS = re.compile(r"\(port (\d+)\)")


def http(port, method, path, body=None, timeout=10):
    """(status, headers dict lower-cased, body bytes) of one request to 127.0.0.1:port."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


class Procs:
    """Children started with their output in a log file; stopped by PID (TERM, then KILL)."""

    def __init__(self, logs):
        self.logs, self.kids = logs, []

    def start(self, name, argv, env=None):
        log = open(os.path.join(self.logs, name + ".log"), "w")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=dict(os.environ, **(env or {})))
        self.kids.append((p, log))
        return p, os.path.join(self.logs, name + ".log")

    def wait_line(self, p, path, pattern, timeout=15):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with open(path) as f:
                m = pattern.findall(f.read())
            if m:
                return m
            if p.poll() is not None:
                raise SystemExit("walkthrough: %s exited: %s" % (path, open(path).read()[-400:]))
            time.sleep(0.05)
        raise SystemExit("walkthrough: %s did not say %s" % (path, pattern.pattern))

    def stop(self):
        for p, _ in self.kids:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        end = time.monotonic() + 5
        for p, log in self.kids:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            log.close()


def adapter(root, name, rank):
    path = os.path.join(root, name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"r": rank, "peft_type": "LORA"}, f)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvrouter", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    exe = os.path.abspath(a.kvrouter)
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="kvr-fleet-")
    sql, chat_a, summ = (adapter(tmp, n, r) for n, r in (("sql", 8), ("chat", 16), ("summ", 8)))
    procs = Procs(tmp)
    lines = [first_line(), "", "# A fleet of two models, LoRA adapters and a data-parallel server",
             "", "Every figure below is what the processes answered in this run "
             "(`kvrouter sim` workers on 127.0.0.1; see the script's header).", ""]
    try:
        sim = [exe, "sim", "--listen", "127.0.0.1:0", "--fixed-ttft-ms", "20",
               "--fixed-itl-ms", "2"]
        fleet = {
            "llama": (sim + ["--model", "meta-llama/Llama-3.1-8B-Instruct",
                             "--served-model-name", "llama-8b", "llama", "-dp", "2"], None),
            "qwen-1": (sim + ["--model", "Qwen/Qwen3-32B", "--served-model-name", "qwen",
                              "--enable-lora", "--lora-modules", "sql=" + sql, "chat=" + chat_a,
                              "--max-loras", "2"], None),
            "qwen-2": (sim + ["--model", "Qwen/Qwen3-32B", "--served-model-name", "qwen",
                              "--enable-lora", "--lora-modules", "sql=" + sql, "--max-loras", "2"],
                       {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}),
        }
        urls = {}
        lines += ["## The fleet", "", "```"]
        for name, (argv, env) in fleet.items():
            p, log = procs.start(name, argv, env)
            urls[name] = "http://127.0.0.1:%s" % procs.wait_line(p, log, LISTEN)[0]
            shown = " ".join(argv[1:]).replace(tmp + "/", "")  # adapter folders by name
            lines.append("%s%s # %s %s" % ("VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 " if env else "",
                                           "kvrouter " + shown, name, urls[name]))
        serve = [exe, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                 "--scrape-interval-ms", "200", "--policy", "kv_aware",
                 "--worker", urls["llama"] + ",dp_size=2", "--worker", urls["qwen-1"],
                 "--worker", urls["qwen-2"], "--lora-adapter", "summ=" + summ]
        p, log = procs.start("router", serve)
        port, admin = (int(x) for x in procs.wait_line(p, log, PORTS)[:2])
        lines.append("kvrouter serve --policy kv_aware --worker %s,dp_size=2 --worker %s "
                     "--worker %s --lora-adapter summ=summ" % (urls["llama"], urls["qwen-1"],
                                                               urls["qwen-2"]))
        lines += ["```", ""]
        end = time.monotonic() + 10
        while time.monotonic() < end:
            ws = json.loads(http(admin, "GET", "/admin/workers")[2])["workers"]
            if len(ws) == 4 and all(w["models"]["known"] for w in ws):
                break
            time.sleep(0.1)
        else:
            raise SystemExit("walkthrough: the router did not read every worker's models")
        label = {}
        lines += ["## The workers as the router sees them (`GET /admin/workers`)", "",
                  "| worker | url | rank | models |", "|---|---|---|---|"]
        for w in ws:
            label[str(w["id"])] = "%s%s" % (w["url"], "" if w.get("dp_rank") is None
                                             else " rank %s" % w["dp_rank"])
            ids = ", ".join("%s%s" % (m["id"], " (adapter of %s)" % m["parent"]
                                      if m.get("parent") else "") for m in w["models"]["ids"])
            rank = "-" if w.get("dp_rank") is None else w["dp_rank"]
            lines.append("| %s | %s | %s | %s |" % (w["id"], w["url"], rank, ids))
        st, _, body = http(port, "GET", "/v1/models")
        models = json.loads(body)["data"]
        lines += ["", "## `GET /v1/models` through the router: %d, the union" % st, "",
                  "| id | parent | root | max_model_len |", "|---|---|---|---|"]
        for m in models:
            root = os.path.basename(m["root"]) if (m.get("root") or "").startswith(tmp) \
                else m.get("root")
            lines.append("| %s | %s | %s | %s |" % (m["id"], json.dumps(m.get("parent")), root,
                                                     json.dumps(m.get("max_model_len"))))
        lines += ["", "## Requests by model (chat completions, 4 tokens each)", "",
                  "| model | status | worker | landed on | body's model |", "|---|---|---|---|---|"]
        for model in ("llama", "llama-8b", "llama", "qwen", "sql", "sql", "chat", "summ", "summ"):
            st, h, body = http(port, "POST", "/v1/chat/completions", {
                "model": model, "max_tokens": 4,
                "messages": [{"role": "user", "content": "Tell me about %s." % model}]})
            wid = h.get("x-kvrouter-worker", "-")
            got = json.loads(body).get("model") if st == 200 else "-"
            lines.append("| %s | %d | %s | %s | %s |" % (model, st, wid, label.get(wid, "-"), got))
        st, _, body = http(port, "POST", "/v1/chat/completions", {
            "model": "mistral", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
        lines += ["", "## A model no worker serves: %d" % st, "", "```json",
                  body.decode().strip(), "```", ""]
        metrics = http(admin, "GET", "/metrics")[2].decode()
        keep = [ln for ln in metrics.splitlines()
                if ln.startswith(("kvrouter_http_requests_total{", "kvrouter_lora_loads_total",
                                  "kvrouter_model_workers"))
                and ("model=" in ln or "lora" in ln or "model_workers" in ln)]
        lines += ["## The `model` label on `/metrics` (the router's admin listener)", "", "```"]
        lines += keep
        lines += ["```", ""]
    finally:
        procs.stop()
    with open(os.path.join(a.out, "REPORT.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
