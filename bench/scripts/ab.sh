#!/bin/sh
# ab.sh -- the policy A/B on 4 simulated workers for the three synthetic workloads.
#
# For each workload (multiturn, documents, control) it runs `kvrouter demo` (4 `kvrouter sim`
# workers + the router, all stopped by PID afterwards) with the four policies round_robin,
# kv_aware, gie_scorer and sglang_cache_aware (labels phase0, phase3, gie, sglang), each with the
# max-SLO-rate search, keeps each workload's report in OUT/<workload>/ and writes AB_RESULTS (by
# default bench/results/AB_RESULTS.md) with the max SLO-compliant rates and the ratios phase3/phase0 per
# workload and kv_aware vs each reference policy.
#
# usage: bench/scripts/ab.sh [KVROUTER] [OUT] [AB_RESULTS]
#   KVROUTER    the binary (default build/kvrouter)
#   OUT         results folder (default results/ab)
#   AB_RESULTS  the summary file (default bench/results/AB_RESULTS.md)
# Environment (at the defaults documents took 23 and multiturn 31 minutes on a 2-core machine):
#   AB_WORKLOADS    "documents multiturn control"
#   AB_TIME_SCALE   4       simulator speed-up (at 10 a 2-core machine, not the simulated cluster, limits capacity)
#   AB_WARMUP_S     60      simulated seconds of warm-up per level (single-turn workloads)
#   AB_WARMUP_MT_S  120     the same for multiturn (sessions need ~2 min to reach their turn mix)
#   AB_LEVEL_S      60      simulated seconds measured per level (at least 100 prompts)
#   AB_RESOLUTION   0.25    search resolution, req/s
#   AB_START        6       search start, req/s
# multiturn runs in session mode (every turn resends the answer streamed back), as `kvrouter demo`.
set -eu

KVR=${1:-build/kvrouter}
OUT=${2:-results/ab}
RES=${3:-bench/results/AB_RESULTS.md}
WORKLOADS=${AB_WORKLOADS:-"documents multiturn control"}
SCALE=${AB_TIME_SCALE:-4}
WARM1=${AB_WARMUP_S:-60}
WARMMT=${AB_WARMUP_MT_S:-120}
LEVEL=${AB_LEVEL_S:-60}
RESOL=${AB_RESOLUTION:-0.25}
START=${AB_START:-6}
POLICIES=round_robin,kv_aware,gie_scorer,sglang_cache_aware
LABELS=phase0,phase3,gie,sglang

[ -x "$KVR" ] || { echo "ab.sh: $KVR is not an executable (build first)" >&2; exit 2; }
mkdir -p "$OUT"
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
t0=$(date +%s)

for w in $WORKLOADS; do
  echo "ab.sh: $w" >&2
  WARM=$WARM1
  [ "$w" = multiturn ] && WARM=$WARMMT
  "$KVR" demo --workload "$w" --ab "$POLICIES" --labels "$LABELS" --time-scale "$SCALE" \
    --out "$OUT/$w" -- --search --search-start "$START" --search-resolution "$RESOL" \
    --num-prompts 100 --warmup 0 --warmup-s "$WARM" --min-level-s "$LEVEL" --cooldown-s 10 \
    >"$OUT/$w.log" 2>&1 || { echo "ab.sh: $w failed, see $OUT/$w.log" >&2; exit 1; }
  # "  <label>   <rate> RPS ..." lines of the summary -> "<label> <rate>"
  awk '/^Max SLO-compliant rate/ {on = 1; next} on && $3 == "RPS" {print $1, $2}' \
    "$OUT/$w.log" >"$OUT/$w.rates"
done
t1=$(date +%s)

rate() { awk -v l="$2" '$1 == l {print $2}' "$OUT/$1.rates"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "n/a"; else printf "%.2fx", a / b }'; }
bar() {
  case "$1" in
  documents) echo ">= 1.5x" ;;
  control) echo ">= 0.95x" ;;
  *) echo "none" ;;
  esac
}
verdict() {
  awk -v r="$1" -v w="$2" 'BEGIN { sub(/x$/, "", r); if (r == "n/a") { print "n/a"; exit }
    if (w == "documents") print (r >= 1.5 ? "met" : "NOT met");
    else if (w == "control") print (r >= 0.95 ? "met" : "NOT met"); else print "-" }'
}

{
  echo "# Policy A/B on 4 simulated workers"
  echo
  echo "Produced by \`bench/scripts/ab.sh $KVR $OUT $RES\` (AB_TIME_SCALE=$SCALE AB_WARMUP_S=$WARM1"
  echo "AB_WARMUP_MT_S=$WARMMT AB_LEVEL_S=$LEVEL AB_RESOLUTION=$RESOL AB_START=$START), started $started, took $((t1 - t0)) s"
  echo "on $(nproc) cores ($(uname -m)). Each workload: \`kvrouter demo --workload W --ab $POLICIES"
  echo "--labels $LABELS --time-scale $SCALE -- --search --search-start $START --search-resolution $RESOL"
  echo "--num-prompts 100 --warmup 0 --warmup-s W --min-level-s $LEVEL --cooldown-s 10\` with W = $WARMMT s"
  echo "for multiturn (session mode) and $WARM1 s otherwise; every label starts from reset prefix caches."
  echo "Max SLO-compliant rate = highest passing rate below the lowest failing one (TTFT p99 < 1000 ms,"
  echo "TPOT p99 < 60 ms, no failures), simulated req/s, search resolution $RESOL req/s: ratios"
  echo "closer than about one resolution step are within the noise. Full reports: $OUT/<workload>/report.md."
  echo
  echo "| workload | round_robin (phase0) | kv_aware (phase3) | gie_scorer | sglang_cache_aware | phase3/phase0 | bar | kv_aware/gie | kv_aware/sglang |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for w in $WORKLOADS; do
    p0=$(rate "$w" phase0)
    p3=$(rate "$w" phase3)
    g=$(rate "$w" gie)
    s=$(rate "$w" sglang)
    r=$(ratio "$p3" "$p0")
    echo "| $w | ${p0:-n/a} | ${p3:-n/a} | ${g:-n/a} | ${s:-n/a} | $r | $(bar "$w") $(verdict "$r" "$w") | $(ratio "$p3" "$g") | $(ratio "$p3" "$s") |"
  done
} >"$RES"
cat "$RES"
