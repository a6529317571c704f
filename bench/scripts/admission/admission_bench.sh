#!/bin/sh
# admission_bench.sh -- the router's admission bound (--admission-max-inflight) at about twice the
# cluster's capacity: N `kvrouter sim` workers and `kvrouter serve` on 127.0.0.1 (free ports picked
# by the kernel), one open-loop `kvrouter bench` level with the bound off, then the same with it on
# (every process restarted between the two, so both start cold), every process stopped by PID
# afterwards (also on Ctrl-C or a failure). Processes are started as bench/scripts/ab/real_ab.sh
# does (worker w is `kvrouter sim --time-scale S --seed w`; the router scrapes every 100 real ms).
#
# The load: the control workload's max SLO-compliant rate with kv_aware is 2.67 simulated req/s on
# 4 workers at time scale 4 (bench/results/ab/REPORT.md), so the default rate, 5.4 req/s, is about
# twice the capacity. The bound, 12 requests per worker, sits under what a worker holds at that
# capacity (20 to 26 in flight per worker measured at 2.7 req/s), and the wait is short: TTFT and
# the wait are simulated times (real x S) while --admission-max-wait-ms is real milliseconds, so
# the default 150 ms is 0.6 simulated seconds at S = 4, within the 1 s TTFT SLO. (16 per worker and
# 500 ms gave a goodput of 0.80 req/s and a TTFT p99 of 1658 ms in one run, against 1.25 and 1460.)
#
# Experiment admission (bench/results/admission/): does the admission bound keep the admitted
# requests' latency in bounds past capacity? Committed run: OUT = bench/results/admission.
#
# usage: bench/scripts/admission/admission_bench.sh KVROUTER OUT
# Environment: ADM_WORKERS (4), ADM_TIME_SCALE (4), ADM_SEED (42), ADM_WORKLOAD (control),
#   ADM_POLICY (kv_aware), ADM_RATE (5.4), ADM_PROMPTS (300), ADM_MAX_INFLIGHT (12),
#   ADM_QUEUE_LIMIT (32), ADM_MAX_WAIT_MS (150).
# Writes OUT/stamp, OUT/off/ and OUT/on/ (the bench's report.md, report.html, results/*.json and
# requests.jsonl; logs/ with each process's log, the bench's console and the router's /metrics at
# the end), OUT/<run>/summary.json (admission_report.py summarize: the measured requests counted)
# and OUT/REPORT.md (admission_report.py render: goodput, TTFT p50/p99 of admitted requests, 503s,
# completed). In bench/results/admission/ git keeps the stamps, summary.json, report.md and
# results/*.json; the HTML, requests.jsonl and logs/ stay out (.gitignore).
set -eu
KVR=$1 OUT=$2
N=${ADM_WORKERS:-4} SCALE=${ADM_TIME_SCALE:-4} SEED=${ADM_SEED:-42}
WORKLOAD=${ADM_WORKLOAD:-control} POLICY=${ADM_POLICY:-kv_aware} RATE=${ADM_RATE:-5.4}
PROMPTS=${ADM_PROMPTS:-300} MAXIN=${ADM_MAX_INFLIGHT:-12} QLIM=${ADM_QUEUE_LIMIT:-32}
WAIT=${ADM_MAX_WAIT_MS:-150}
mkdir -p "$OUT"
. "$(dirname "$0")/../lib/procs.sh"
# the report's first line names this command (bench/scripts/lib/provenance.py)
KVR_REPORT_COMMAND=$(python3 "$(dirname "$0")/../lib/provenance.py" command --env ADM_ -- \
  sh "$0" "$@")
export KVR_REPORT_COMMAND
trap stop EXIT INT TERM

# run_once LABEL [ROUTER-FLAGS...]: fresh workers and router, one bench level into OUT/LABEL.
run_once() {
  label=$1
  shift
  dir="$OUT/$label"
  rm -rf "$dir"
  mkdir -p "$dir/logs"
  start_sims "$N" "$SCALE" "$dir/logs"
  start_router admission_bench.sh "$POLICY" "$dir/logs/router.log" "$@"
  echo "router_flags=$*" >"$dir/stamp"
  "$KVR" bench --url "http://127.0.0.1:$RP" --workload "$WORKLOAD" --rates "$RATE" \
    --num-prompts "$PROMPTS" --time-scale "$SCALE" --seed "$SEED" --cooldown-s 0 \
    --title "admission bound $label" --out "$dir" --quiet >"$dir/logs/bench.txt" 2>&1 || true
  curl -sf "http://127.0.0.1:$AP/metrics" >"$dir/logs/router-metrics.txt" || true
  stop
}

start=$(date -u +%s)
{
  echo "commit=$(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "started=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "workers=$N time_scale=$SCALE seed=$SEED workload=$WORKLOAD policy=$POLICY rate=$RATE prompts=$PROMPTS"
  echo "bound=--admission-max-inflight $MAXIN --admission-queue-limit $QLIM --admission-max-wait-ms $WAIT"
  echo "cores=$(nproc) arch=$(uname -m)"
} >"$OUT/stamp"
run_once off
run_once on --admission-max-inflight "$MAXIN" --admission-queue-limit "$QLIM" \
  --admission-max-wait-ms "$WAIT"
echo "took_s=$(($(date -u +%s) - start))" >>"$OUT/stamp"

HERE=$(dirname "$0")
python3 "$HERE/admission_report.py" summarize "$OUT"
python3 "$HERE/admission_report.py" render "$OUT" "$OUT/REPORT.md"
