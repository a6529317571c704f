#!/bin/sh
# ab.sh -- the policy A/B on 4 simulated workers for the three synthetic workloads.
#
# Experiment ab (bench/results/ab/): does kv_aware serve a higher max SLO-compliant rate than the
# other policies in real time? Writes AB_RAW (default bench/results/ab/raw/main/<workload>/) and the
# report AB_RESULTS (default bench/results/ab/REPORT.md, its first line this command and the
# commit); OUT (default results/ab) holds the full output and is not kept.
#
# For each workload (multiturn, documents, control) it runs bench/scripts/ab/real_ab.sh (4 `kvrouter
# sim` workers and `kvrouter serve` on 127.0.0.1, all stopped by PID afterwards, and one `kvrouter
# bench --ab ... --search` against them) with the four policies round_robin, kv_aware, gie_scorer
# and sglang_cache_aware (labels phase0, phase3, gie, sglang), each with the max-SLO-rate search,
# then renders AB_RESULTS with bench/scripts/ab/ab_report.py: per workload the time scale, each
# policy's max SLO-compliant rate and kv_aware's ratio to each other policy. (Until the ninth
# session it ran `kvrouter demo`, which since issue 16 is a virtual study plus a short real-time
# confirmation and no longer searches every policy in real time.)
#
# Where the results go:
#   OUT/<workload>/       real_ab.sh's full output (report.md, requests.jsonl, summary.txt, logs),
#                         emptied first; OUT/<workload>.log its console; not kept in git.
#   AB_RAW/<workload>/    the small raw files kept in git: stamp (commit, start, duration, options,
#                         the bench command line as cmd=), rates ("<label> <rate>": the max
#                         SLO-compliant rates the bench printed) and results/*.json (the per-level
#                         JSON of every level searched). Written once the workload's A/B succeeded
#                         with a rate and levels for every label; workloads not run keep their
#                         folders, stamps included.
#   AB_RESULTS            rendered from AB_RAW only (`bench/scripts/ab/ab_report.py AB_RAW
#                         AB_RESULTS` re-renders it; several raw folders render together, e.g. the
#                         committed report: `python3 bench/scripts/ab/ab_report.py
#                         bench/results/ab/raw/main bench/results/ab/raw/refs
#                         bench/results/ab/REPORT.md`, where raw/refs is a run with
#                         AB_POLICIES=dynamo_kv,llmd_precise AB_LABELS=dynamo,llmd
#                         AB_RAW=bench/results/ab/raw/refs); each row names its own run. The
#                         hand-written reading is bench/results/ab/NOTES.md, which this script
#                         never writes.
#
# usage: bench/scripts/ab/ab.sh [KVROUTER] [OUT] [AB_RESULTS]
#   KVROUTER    the binary (default build/kvrouter)
#   OUT         working folder (default results/ab)
#   AB_RESULTS  the summary file (default bench/results/ab/REPORT.md)
# Environment (at the defaults documents took 23 and multiturn 31 minutes on a 2-core machine):
#   AB_WORKLOADS    "documents multiturn control"
#   AB_RAW          bench/results/ab/raw/main   the kept raw files (above)
#   AB_POLICIES     round_robin,kv_aware,gie_scorer,sglang_cache_aware
#   AB_LABELS       phase0,phase3,gie,sglang
#   AB_TIME_SCALE   4       simulator speed-up (at 10 a 2-core machine, not the simulated
#                           cluster, limits capacity)
#   AB_WARMUP_S     60      simulated seconds of warm-up per level (single-turn workloads)
#   AB_WARMUP_MT_S  120     the same for multiturn (sessions need ~2 min to reach their turn mix)
#   AB_LEVEL_S      60      simulated seconds measured per level (at least AB_NUM_PROMPTS prompts)
#   AB_NUM_PROMPTS  100     measured prompts per level at least
#   AB_RESOLUTION   0.25    search resolution, req/s
#   AB_START        6       search start, req/s
#   AB_SEARCH_MAX   (unset: the bench's default) search ceiling, req/s
#   AB_COOLDOWN_S   10      pause between levels, s
#   AB_SEED         42      the bench's seed (arrivals and prompts)
# multiturn runs in session mode (every turn resends the answer streamed back), as `kvrouter demo`.
# A quick check into scratch folders (seconds):
#   AB_WORKLOADS=control AB_POLICIES=round_robin,kv_aware AB_LABELS=phase0,phase3 AB_TIME_SCALE=10 \
#   AB_WARMUP_S=2 AB_LEVEL_S=2 AB_NUM_PROMPTS=10 AB_START=1 AB_RESOLUTION=1 AB_SEARCH_MAX=2 \
#   AB_COOLDOWN_S=0 AB_RAW=/tmp/ab/raw bench/scripts/ab/ab.sh build/kvrouter /tmp/ab/out \
#   /tmp/ab/AB.md
set -eu

KVR=${1:-build/kvrouter}
OUT=${2:-results/ab}
RES=${3:-bench/results/ab/REPORT.md}
WORKLOADS=${AB_WORKLOADS:-"documents multiturn control"}
RAW=${AB_RAW:-bench/results/ab/raw/main}
POLICIES=${AB_POLICIES:-round_robin,kv_aware,gie_scorer,sglang_cache_aware}
LABELS=${AB_LABELS:-phase0,phase3,gie,sglang}
SCALE=${AB_TIME_SCALE:-4}
WARM1=${AB_WARMUP_S:-60}
WARMMT=${AB_WARMUP_MT_S:-120}
LEVEL=${AB_LEVEL_S:-60}
PROMPTS=${AB_NUM_PROMPTS:-100}
RESOL=${AB_RESOLUTION:-0.25}
START=${AB_START:-6}
SEARCH_MAX=${AB_SEARCH_MAX:-}
COOLDOWN=${AB_COOLDOWN_S:-10}
SEED=${AB_SEED:-42}
HERE=$(cd "$(dirname "$0")" && pwd)

[ -x "$KVR" ] || { echo "ab.sh: $KVR is not an executable (build first)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "ab.sh: needs python3" >&2; exit 2; }
# the report's first line names this command (bench/scripts/lib/provenance.py)
KVR_REPORT_COMMAND=$(python3 "$HERE/../lib/provenance.py" command --env AB_ -- sh "$0" "$@")
export KVR_REPORT_COMMAND
mkdir -p "$OUT" "$RAW"

# The repository's commit ("+dirty" when tracked files differ from it).
commit() {
  rev=$(git -C "$HERE" rev-parse --short HEAD 2>/dev/null) || { echo unknown; return; }
  [ -z "$(git -C "$HERE" status --porcelain --untracked-files=no 2>/dev/null)" ] || rev="$rev+dirty"
  echo "$rev"
}

for w in $WORKLOADS; do
  echo "ab.sh: $w" >&2
  WARM=$WARM1
  [ "$w" = multiturn ] && WARM=$WARMMT
  max=
  [ -z "$SEARCH_MAX" ] || max="--search-max $SEARCH_MAX"
  started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  t0=$(date +%s)
  rev=$(commit)
  rm -rf "${OUT:?}/$w" # nothing of an earlier run may be taken for this one's
  # shellcheck disable=SC2086 # $max is empty or two words
  RAB_TIME_SCALE=$SCALE RAB_SEED=$SEED sh "$HERE/real_ab.sh" "$KVR" "$OUT/$w" "$w" "$POLICIES" \
    "$LABELS" --search --search-start "$START" --search-resolution "$RESOL" $max \
    --num-prompts "$PROMPTS" --warmup 0 --warmup-s "$WARM" --min-level-s "$LEVEL" \
    --cooldown-s "$COOLDOWN" >"$OUT/$w.log" 2>&1 || { echo "ab.sh: $w failed, see $OUT/$w.log" >&2; exit 1; }
  t1=$(date +%s)
  # "  <label>   <rate> RPS ..." lines of the bench's summary -> "<label> <rate>"
  awk '/^Max SLO-compliant rate/ {on = 1; next} on && $3 == "RPS" {print $1, $2}' \
    "$OUT/$w/summary.txt" >"$OUT/$w.rates"
  # Every label must have its rate and levels, or the kept raw files would describe no run.
  if grep -q "no level ran to its end" "$OUT/$w/summary.txt"; then
    echo "ab.sh: $w: a label ran no level to its end, see $OUT/$w/summary.txt" >&2
    exit 1
  fi
  for l in $(echo "$LABELS" | tr , ' '); do
    awk -v l="$l" '$1 == l {f = 1} END {exit !f}' "$OUT/$w.rates" || { echo "ab.sh: $w: no max SLO-compliant rate for $l in $OUT/$w/summary.txt" >&2; exit 1; }
    ls "$OUT/$w/results/${l}_rate"*.json >/dev/null 2>&1 || { echo "ab.sh: $w: no level results for $l in $OUT/$w/results" >&2; exit 1; }
  done
  rm -rf "${RAW:?}/$w"
  mkdir -p "$RAW/$w/results"
  cp "$OUT/$w.rates" "$RAW/$w/rates"
  # Kept without the per-request arrays (ab_report.py reads the levels' aggregates only).
  python3 "$HERE/../lib/level_json.py" slim "$RAW/$w/results" "$OUT/$w"/results/*.json
  {
    echo "workload=$w"
    echo "commit=$rev"
    echo "started=$started"
    echo "finished=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "took_s=$((t1 - t0))"
    echo "binary=$KVR"
    echo "kvrouter=$("$KVR" --version)" # the binary's own commit; commit= is the checkout's
    echo "time_scale=$SCALE"
    echo "warmup_s=$WARM"
    echo "level_s=$LEVEL"
    echo "num_prompts=$PROMPTS"
    echo "resolution=$RESOL"
    echo "start=$START"
    echo "search_max=$SEARCH_MAX"
    echo "policies=$POLICIES"
    echo "labels=$LABELS"
    echo "cores=$(nproc)"
    echo "arch=$(uname -m)"
    grep '^cmd=' "$OUT/$w/stamp"
  } >"$RAW/$w/stamp"
done

python3 "$HERE/ab_report.py" "$RAW" "$RES"
