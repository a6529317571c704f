#!/usr/bin/env python3
"""test_vllm_result_compat.py -- kvrouter bench's result JSON read with vllm's own logic (issue 34).

`kvrouter bench --save-result` writes each level's JSON where `vllm bench serve --save-result` puts
it and as vllm writes it. This test runs two small `kvrouter bench --virtual` levels spelled as vllm
is spelled and reads their files with code copied from vllm (vllm/benchmarks/serve.py at
vllm-project/vllm commit 009e6d4a1cd6ba3fb2a9fc00f4ec06f5297232a1, Apache-2.0): compute_result_
filename() names the file, main_async() and benchmark() give the keys in their order,
process_one_metric() the percentile keys, save_to_pytorch_benchmark_format() the metrics its CI
reader takes, and calculate_metrics() recomputes every summary figure from the per-request arrays
(its numpy calls through a shim with numpy's definitions: np.percentile's 'linear' method, np.std's
population deviation). Checked:

- the file name is exactly compute_result_filename()'s, the date vllm's %Y%m%d-%H%M%S;
- the keys are vllm's, in vllm's order, each of vllm's JSON type (a float a float, an int an int);
- each summary figure is what calculate_metrics() makes of the arrays: completed, failed, token
  totals, throughputs, request_goodput under --goodput ttft/tpot/e2el, max_output_tokens_per_s and
  max_concurrent_requests from the exact ITLs (--save-detailed), every mean/median/std/pN key;
- the arrays have vllm's meaning: one entry per prompt, in send order, itls one gap per streamed
  token, generated_texts the text;
- a timed_trace at its own times under --max-concurrency: request_rate "inf", the file name's
  "infqps-concurrencyN", input_lens the trace's first --num-prompts lengths in file order, the
  client_queue_time keys from queue_times (vllm writes them with a concurrency cap) and no
  e2el_including_client_queue (vllm leaves it out at rate inf).

Usage: python3 tests/bench/scripts/test_vllm_result_compat.py --kvrouter PATH/TO/kvrouter
"""
import argparse
import glob
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
TRACE = os.path.join(HERE, "..", "loadgen", "trace_mooncake_3401_3600.jsonl")
MILLISECONDS_TO_SECONDS_CONVERSION = 1000


class np:  # noqa: N801 -- the numpy calls vllm's code below makes, with numpy's definitions
    @staticmethod
    def _list(x):
        return list(x) if isinstance(x, (list, tuple)) else [x]

    @staticmethod
    def mean(x):
        v = np._list(x)
        return sum(v) / len(v)

    @staticmethod
    def std(x):
        v = np._list(x)
        m = sum(v) / len(v)
        return math.sqrt(sum((a - m) ** 2 for a in v) / len(v))

    @staticmethod
    def percentile(x, p):  # method='linear'
        v = sorted(np._list(x))
        pos = p / 100.0 * (len(v) - 1)
        lo = int(math.floor(pos))
        hi = min(lo + 1, len(v) - 1)
        return v[lo] + (v[hi] - v[lo]) * (pos - lo)

    @staticmethod
    def median(x):
        return np.percentile(x, 50)

    ceil = staticmethod(math.ceil)

    @staticmethod
    def zeros(n):
        return [0.0] * n

    @staticmethod
    def max(x):
        return max(x)


# ---- vllm's code (serve.py), copied; only the tokenizer branch and the plots left out -----------

def compute_result_filename(args, model_id, label, current_dt):
    if not (args.plot_timeline or args.save_result or args.append_result):
        return None
    base_model_id = model_id.split("/")[-1]
    max_concurrency_str = (
        f"-concurrency{args.max_concurrency}" if args.max_concurrency is not None else ""
    )
    label = label or args.backend
    if args.ramp_up_strategy is not None:
        file_name = f"{label}-ramp-up-{args.ramp_up_strategy}-{args.ramp_up_start_rps}qps-{args.ramp_up_end_rps}qps{max_concurrency_str}-{base_model_id}-{current_dt}.json"  # noqa
    else:
        file_name = f"{label}-{args.request_rate}qps{max_concurrency_str}-{base_model_id}-{current_dt}.json"  # noqa
    if args.result_filename:
        file_name = args.result_filename
    if args.result_dir:
        file_name = os.path.join(args.result_dir, file_name)
    return file_name


def calculate_metrics(outputs, dur_s, selected_percentiles, goodput_config_dict):
    actual_output_lens = []
    total_input = 0
    completed = 0
    good_completed = 0
    itls, tpots, all_tpots, ttfts, e2els = [], [], [], [], []
    for i in range(len(outputs)):
        if outputs[i].success:
            output_len = outputs[i].output_tokens
            actual_output_lens.append(output_len)
            total_input += outputs[i].prompt_len
            tpot = 0.0
            if output_len > 1:
                latency_minus_ttft = outputs[i].latency - outputs[i].ttft
                tpot = latency_minus_ttft / (output_len - 1)
                tpots.append(tpot)
            all_tpots.append(tpot)
            itls += outputs[i].itl
            ttfts.append(outputs[i].ttft)
            e2els.append(outputs[i].latency)
            completed += 1
        else:
            actual_output_lens.append(0)
    if goodput_config_dict:
        valid_metrics, slo_values = [], []
        if "ttft" in goodput_config_dict:
            valid_metrics.append(ttfts)
            slo_values.append(goodput_config_dict["ttft"] / MILLISECONDS_TO_SECONDS_CONVERSION)
        if "tpot" in goodput_config_dict:
            valid_metrics.append(all_tpots)
            slo_values.append(goodput_config_dict["tpot"] / MILLISECONDS_TO_SECONDS_CONVERSION)
        if "e2el" in goodput_config_dict:
            valid_metrics.append(e2els)
            slo_values.append(goodput_config_dict["e2el"] / MILLISECONDS_TO_SECONDS_CONVERSION)
        for req_metric in zip(*valid_metrics):
            is_good_req = all([s >= r for s, r in zip(slo_values, req_metric)])
            if is_good_req:
                good_completed += 1
    max_output_tokens_per_s = 0.0
    max_concurrent_requests = 0
    successful_outputs = [output for output in outputs if output.success]
    failed_outputs = [output for output in outputs if not output.success]
    if successful_outputs:
        min_start_time = min(output.start_time for output in successful_outputs)
        max_end_time = max(output.start_time + output.latency for output in successful_outputs)
        duration_seconds = int(np.ceil(max_end_time - min_start_time)) + 1
        tokens_per_second = np.zeros(duration_seconds)
        for i, output in enumerate(successful_outputs):
            token_times = [output.start_time + output.ttft]
            current_time = token_times[0]
            for itl_value in output.itl:
                current_time += itl_value
                token_times.append(current_time)
            for token_time in token_times:
                second_bucket = int(token_time - min_start_time)
                if 0 <= second_bucket < duration_seconds:
                    tokens_per_second[second_bucket] += 1
        events = []
        for output in successful_outputs:
            # (here only: at the virtual clock's resolution, 1 ns, a send at the instant another
            # request ended stays the tie it is; the float sum of the written seconds can break it)
            events.append((round(output.start_time * 1e9), 1))
            events.append((round((output.start_time + output.latency) * 1e9), -1))
        events.sort(key=lambda x: (x[0], x[1]))
        current_concurrency = 0
        peak_concurrency = 0
        for _, delta in events:
            current_concurrency += delta
            if current_concurrency > peak_concurrency:
                peak_concurrency = current_concurrency
        if len(tokens_per_second) > 0:
            max_output_tokens_per_s = float(np.max(tokens_per_second))
            max_concurrent_requests = peak_concurrency
    m = SimpleNamespace(
        completed=completed, failed=len(failed_outputs), total_input=total_input,
        total_output=sum(actual_output_lens), request_throughput=completed / dur_s,
        request_goodput=good_completed / dur_s,
        output_throughput=sum(actual_output_lens) / dur_s,
        total_token_throughput=(total_input + sum(actual_output_lens)) / dur_s,
        max_output_tokens_per_s=max_output_tokens_per_s,
        max_concurrent_requests=max_concurrent_requests)
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        setattr(m, "mean_%s_ms" % name, np.mean(values or 0) * 1000)
        setattr(m, "std_%s_ms" % name, np.std(values or 0) * 1000)
        setattr(m, "median_%s_ms" % name, np.median(values or 0) * 1000)
        setattr(m, "percentiles_%s_ms" % name,
                [(p, np.percentile(values or 0, p) * 1000) for p in selected_percentiles])
    return m, actual_output_lens


def process_one_metric(result, metrics, selected_percentile_metrics, selected_percentiles,
                       metric_attribute_name, values=None):
    """benchmark()'s process_one_metric, less its printing: the keys it adds to result."""
    if metric_attribute_name not in selected_percentile_metrics:
        return
    if values is None:
        mean = getattr(metrics, f"mean_{metric_attribute_name}_ms")
        median = getattr(metrics, f"median_{metric_attribute_name}_ms")
        std = getattr(metrics, f"std_{metric_attribute_name}_ms")
        percentiles = getattr(metrics, f"percentiles_{metric_attribute_name}_ms")
    else:
        mean = np.mean(values or 0) * 1000
        median = np.median(values or 0) * 1000
        std = np.std(values or 0) * 1000
        percentiles = [(p, np.percentile(values or 0, p) * 1000) for p in selected_percentiles]
    result[f"mean_{metric_attribute_name}_ms"] = mean
    result[f"median_{metric_attribute_name}_ms"] = median
    result[f"std_{metric_attribute_name}_ms"] = std
    for p, value in percentiles:
        p_word = str(int(p)) if int(p) == p else str(p)
        result[f"p{p_word}_{metric_attribute_name}_ms"] = value


# save_to_pytorch_benchmark_format(): the metrics vllm's CI reader takes from a result file.
PYTORCH_METRICS = ["median_ttft_ms", "mean_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                   "median_tpot_ms", "std_tpot_ms", "p99_tpot_ms", "median_itl_ms", "mean_itl_ms",
                   "std_itl_ms", "p99_itl_ms"]

# main_async()'s keys before the benchmark's, and benchmark()'s result dict, in order.
HEAD = ["date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts"]
TRAFFIC = ["request_rate", "burstiness", "max_concurrency"]
RESULT = ["duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
          "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
          "input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times",
          "generated_texts", "errors", "max_output_tokens_per_s", "max_concurrent_requests", "rtfx"]
DETAILED = {"input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts",
            "errors"}  # main_async() drops these without --save-detailed

# The JSON type of each key as vllm writes it (float(), int, numpy float64, lists of those).
FLOAT = {"duration", "request_throughput", "output_throughput", "total_token_throughput",
         "max_output_tokens_per_s", "rtfx", "burstiness"}
INT = {"num_prompts", "completed", "failed", "total_input_tokens", "total_output_tokens",
       "max_concurrent_requests"}
STR = {"date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id"}


# ---- the checks --------------------------------------------------------------------------------

def close(a, b, what):
    assert abs(a - b) <= 1e-6 * max(1.0, abs(b)), "%s: kvrouter %r, vllm's logic %r" % (what, a, b)


def check_types(d):
    for k in FLOAT:
        assert type(d[k]) is float, (k, d[k])
    for k in INT:
        assert type(d[k]) is int, (k, d[k])
    for k in STR:
        assert type(d[k]) is str, (k, d[k])
    assert d["request_rate"] == "inf" or type(d["request_rate"]) is float, d["request_rate"]
    assert d["max_concurrency"] is None or type(d["max_concurrency"]) is int
    assert d["request_goodput"] is None or type(d["request_goodput"]) is float
    for k in ("ttfts", "latencies", "start_times", "queue_times"):
        assert all(type(x) is float for x in d[k]), k
    for k in ("input_lens", "output_lens"):
        assert all(type(x) is int for x in d[k]), k
    assert all(type(x) is str for x in d["errors"] + d["generated_texts"])
    assert all(type(one) is list and all(type(x) is float for x in one) for one in d["itls"])
    for k, v in d.items():
        if re.match(r"(mean|median|std|p[0-9.]+)_\w+_ms$", k):
            assert type(v) is float, (k, v)
    assert re.fullmatch(r"\d{8}-\d{6}", d["date"]), d["date"]


def outputs_of(d):
    """vllm's RequestFuncOutput list as the arrays give it back."""
    return [SimpleNamespace(success=e == "", prompt_len=i, output_tokens=o, ttft=t, itl=itl,
                            latency=lat, start_time=s)
            for i, o, t, itl, lat, s, e in zip(d["input_lens"], d["output_lens"], d["ttfts"],
                                               d["itls"], d["latencies"], d["start_times"],
                                               d["errors"])]


def check_file(d, args, metadata, percentile_metrics, percentiles, goodput):
    """The keys in vllm's order and every figure as vllm computes it from the arrays."""
    check_types(d)
    metrics, output_lens = calculate_metrics(outputs_of(d), d["duration"], percentiles, goodput)
    want = {}
    if args.max_concurrency is not None:
        qt = [q for q, e in zip(d["queue_times"], d["errors"]) if e == ""]
    for name in ("ttft", "tpot", "itl", "e2el"):
        process_one_metric(want, metrics, percentile_metrics, percentiles, name)
    if args.max_concurrency is not None:
        process_one_metric(want, metrics, percentile_metrics, percentiles, "client_queue_time",
                           qt)
        if not math.isinf(float(args.request_rate)):
            e2q = [lat + q for lat, q, e in zip(d["latencies"], d["queue_times"], d["errors"])
                   if e == ""]
            process_one_metric(want, metrics, percentile_metrics, percentiles,
                               "e2el_including_client_queue", e2q)
    keys = HEAD + list(metadata) + TRAFFIC + RESULT + list(want)
    got = [k for k in d if k != "kvrouter"]
    assert got == keys, "keys:\n%s\nvllm's:\n%s" % (got, keys)
    for k, v in metadata.items():
        assert d[k] == v, (k, d[k])
    for k, v in want.items():
        close(d[k], v, k)
    n = d["num_prompts"]
    assert all(len(d[k]) == n for k in RESULT if isinstance(d[k], list)), n
    assert d["completed"] == metrics.completed and d["failed"] == metrics.failed
    assert d["completed"] + d["failed"] == n
    assert d["total_input_tokens"] == metrics.total_input
    assert d["total_output_tokens"] == metrics.total_output and d["output_lens"] == output_lens
    for k in ("request_throughput", "output_throughput", "total_token_throughput",
              "max_output_tokens_per_s"):
        close(d[k], getattr(metrics, k), k)
    if goodput:
        close(d["request_goodput"], metrics.request_goodput, "request_goodput")
    assert d["max_concurrent_requests"] == metrics.max_concurrent_requests, (
        d["max_concurrent_requests"], metrics.max_concurrent_requests)
    # duration: the first send to the last completion
    ends = [s + lat for s, lat, e in zip(d["start_times"], d["latencies"], d["errors"]) if not e]
    close(d["duration"], max(ends) - min(d["start_times"]), "duration")
    # the arrays' meaning: send order; one ITL per streamed token after the first; the text
    assert d["start_times"] == sorted(d["start_times"]), "not in send order"
    for i in range(n):
        if d["errors"][i] == "":
            assert len(d["itls"][i]) == d["output_lens"][i] - 1, (i, len(d["itls"][i]))
            assert d["generated_texts"][i], i
            close(d["latencies"][i], d["ttfts"][i] + sum(d["itls"][i]), "latency %d" % i)
    for k in PYTORCH_METRICS:
        assert k in d, k  # save_to_pytorch_benchmark_format() reads these


def bench(kvrouter, *args):
    p = subprocess.run([kvrouter, "bench"] + [str(a) for a in args], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, "bench failed (%d):\n%s\n%s" % (p.returncode, p.stdout, p.stderr)


def vllm_args(**kw):
    a = dict(plot_timeline=False, save_result=True, append_result=False, max_concurrency=None,
             backend="openai", ramp_up_strategy=None, result_filename=None, result_dir=None,
             request_rate=float("inf"))
    a.update(kw)
    return SimpleNamespace(**a)


def the_file(folder, args, model_id):
    """The one file in folder, checked against compute_result_filename(); its JSON."""
    files = glob.glob(os.path.join(folder, "*.json"))
    assert len(files) == 1, files
    d = json.load(open(files[0]))
    assert files[0] == compute_result_filename(args, model_id, None, d["date"]), files[0]
    return d


def sharegpt_file(path):
    """A ShareGPT file: 60 entries of 2-4 messages, some vllm filters out (prompt or reply under 4
    tokens, prompt over 1,024)."""
    rng = random.Random(3)
    words = "the a of to in is it on cat dog runs far and blue sky over when".split()
    data = []
    for i in range(60):
        n = rng.choice([2, 8, 40, 200, 300, 1500]) if i % 7 else 1
        conv = [{"from": "human", "value": " ".join(rng.choice(words) for _ in range(n))},
                {"from": "gpt", "value": " ".join(rng.choice(words)
                                                  for _ in range(rng.randint(1, 150)))}]
        if i % 3 == 0:
            conv += [{"from": "human", "value": "and then?"}, {"from": "gpt", "value": "ok"}]
        data.append({"id": str(i), "conversations": conv})
    with open(path, "w") as f:
        json.dump(data, f)


def test_sharegpt_rate(kvrouter, tmp):
    """--dataset-name sharegpt at a Poisson rate, every key and figure as vllm's."""
    data = os.path.join(tmp, "sharegpt.json")
    sharegpt_file(data)
    res = os.path.join(tmp, "r1")
    pcts, metrics = [25.0, 50.0, 99.0, 99.9], ["ttft", "tpot", "itl", "e2el"]
    goodput = {"ttft": 400.0, "tpot": 30.0, "e2el": 8000.0}
    bench(kvrouter, "--virtual", "--workers", 2, "--dataset-name", "sharegpt", "--dataset-path",
          data, "--request-rate", 3, "--num-prompts", 40, "--save-result", "--save-detailed",
          "--result-dir", res, "--goodput", "ttft:400", "tpot:30", "e2el:8000",
          "--percentile-metrics", ",".join(metrics), "--metric-percentiles", "25,50,99,99.9",
          "--metadata", "run=ci", "tp=1", "--out", os.path.join(tmp, "o1"), "--quiet")
    args = vllm_args(request_rate=3.0, result_dir=res)
    d = the_file(res, args, d_model(tmp, "o1"))
    assert d["backend"] == "openai" and d["endpoint_type"] == "openai", d["backend"]
    assert d["request_rate"] == 3.0 and d["max_concurrency"] is None and d["num_prompts"] == 40
    check_file(d, args, {"run": "ci", "tp": "1"}, metrics, pcts, goodput)
    assert d["failed"] == 0 and d["queue_times"] == [0.0] * 40, d["queue_times"]
    print("  sharegpt: %d keys, %d requests" % (len(d), d["num_prompts"]))


def test_timed_trace_capped(kvrouter, tmp):
    """--dataset-name timed_trace at its own times under --max-concurrency 4."""
    res = os.path.join(tmp, "r2")
    # no --metric-percentiles: kvrouter's default, what vllm writes with 50,90,95,99 (its own: 99)
    pcts, metrics = [50.0, 90.0, 95.0, 99.0], ["ttft", "tpot", "itl", "e2el", "client_queue_time",
                                               "e2el_including_client_queue"]
    bench(kvrouter, "--virtual", "--workers", 2, "--dataset-name", "timed_trace",
          "--dataset-path", TRACE, "--timed-trace-sec-multiplier", 0.001,
          "--timed-trace-chunk-hash-size", 512, "--num-prompts", 30, "--max-concurrency", 4,
          "--save-result", "--save-detailed", "--result-dir", res, "--percentile-metrics",
          ",".join(metrics), "--out", os.path.join(tmp, "o2"), "--quiet")
    args = vllm_args(max_concurrency=4, result_dir=res)
    d = the_file(res, args, d_model(tmp, "o2"))
    assert "-infqps-concurrency4-" in os.path.basename(glob.glob(os.path.join(res, "*"))[0])
    assert d["request_rate"] == "inf" and d["max_concurrency"] == 4, d["request_rate"]
    check_file(d, args, {}, metrics, pcts, {})
    assert "p99_client_queue_time_ms" in d and "p99_e2el_including_client_queue_ms" not in d
    assert d["max_concurrent_requests"] <= 4, d["max_concurrent_requests"]
    with open(TRACE) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    assert d["input_lens"] == [r["input_length"] for r in recs[:30]], d["input_lens"]
    assert max(d["queue_times"]) > 0, "no request waited for one of the 4 slots"
    print("  timed_trace: %d requests, the longest wait for a slot %.1f s"
          % (d["num_prompts"], max(d["queue_times"])))


def d_model(tmp, out):
    """The model the run named (kvrouter's own JSON of the level)."""
    f = glob.glob(os.path.join(tmp, out, "results", "*.json"))[0]
    return json.load(open(f))["model_id"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvrouter", required=True)
    kvrouter = os.path.abspath(ap.parse_args().kvrouter)
    tmp = tempfile.mkdtemp(prefix="kvr_vllm_compat_")
    failed = 0
    try:
        for t in (test_sharegpt_rate, test_timed_trace_capped):
            try:
                t(kvrouter, tmp)
                print("PASS %s" % t.__name__)
            except AssertionError as e:
                failed += 1
                print("FAIL %s: %s" % (t.__name__, str(e)[:3000]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
