#!/bin/sh
# real_ab.sh -- a real-time A/B on one machine, without the demo's virtual steps: N `kvrouter sim`
# workers and `kvrouter serve` on 127.0.0.1, one `kvrouter bench --ab ... --search` against them,
# every process stopped by PID afterwards (also on Ctrl-C or a failure).
#
# Experiment ab (bench/results/ab/): ab.sh runs it for each workload; run by hand it made the tuned
# kv_aware's real-time confirmation, whose stamp, summary.txt and results/*.json are kept in
# bench/results/ab/raw/tuned/<workload>/ (read by bench/scripts/agreement/agreement.py). Writes OUT
# only.
#
# The processes are started exactly as `kvrouter demo` started them when the A/B of
# bench/results/ab/raw/main was measured (commit 775aa0e): worker w is `kvrouter sim --time-scale S
# --seed w`, the router `kvrouter serve --policy round_robin --access-log false
# --scrape-interval-ms 100` (100 real ms: S x 100 simulated ms), so a policy measured here is
# comparable with those runs.
#
# usage: bench/scripts/ab/real_ab.sh KVROUTER OUT WORKLOAD POLICIES LABELS [BENCH-FLAGS...]
# Environment: RAB_WORKERS (4), RAB_TIME_SCALE (4), RAB_SEED (42).
# Writes OUT/ (the bench's report and results/*.json), OUT/logs/*.log and OUT/stamp.
set -eu
KVR=$1 OUT=$2 WORKLOAD=$3 POLICIES=$4 LABELS=$5
shift 5
N=${RAB_WORKERS:-4} SCALE=${RAB_TIME_SCALE:-4} SEED=${RAB_SEED:-42}
mkdir -p "$OUT/logs"
. "$(dirname "$0")/../lib/procs.sh"
trap stop EXIT INT TERM
start_sims "$N" "$SCALE" "$OUT/logs"
start_router real_ab.sh round_robin "$OUT/logs/router.log"
MODE=""
[ "$WORKLOAD" = multiturn ] && MODE="--multiturn-mode session"
start=$(date -u +%s)
{
  echo "workload=$WORKLOAD"
  echo "commit=$(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "kvrouter=$("$KVR" --version)"
  echo "started=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "time_scale=$SCALE"
  echo "cmd=kvrouter bench --url URL --admin ADMIN --workload $WORKLOAD ${MODE:+$MODE }--ab $POLICIES --labels $LABELS --time-scale $SCALE --seed $SEED $*"
} >"$OUT/stamp"
# Not piped into tee: a pipeline's status is tee's, and a bench that failed or was interrupted
# (it still prints a summary) must fail this script.
rc=0
# shellcheck disable=SC2086
"$KVR" bench --url "http://127.0.0.1:$RP" --admin "http://127.0.0.1:$AP" --workload "$WORKLOAD" \
  $MODE --ab "$POLICIES" --labels "$LABELS" --time-scale "$SCALE" --seed "$SEED" --out "$OUT" \
  --quiet "$@" >"$OUT/summary.txt" || rc=$?
cat "$OUT/summary.txt"
echo "took_s=$(($(date -u +%s) - start))" >>"$OUT/stamp"
[ "$rc" -eq 0 ] || { echo "real_ab.sh: kvrouter bench exited with status $rc" >&2; exit "$rc"; }
