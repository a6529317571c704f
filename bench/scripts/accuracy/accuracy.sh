#!/usr/bin/env bash
# accuracy.sh -- the load generator's accuracy and time-scale claims, measured; writes the report.
#
# Experiment accuracy (bench/results/accuracy/): are the load generator's latencies, send times and
# time scale accurate? Writes ACC_RAW (default bench/results/accuracy/raw/<run>/) and the report
# ACCURACY_MD (default bench/results/accuracy/REPORT.md, its first line this command and the
# commit); OUT (default results/accuracy) holds the full output and is not kept.
#
# Every process it starts listens on 127.0.0.1 with a port the kernel picks (`--listen
# 127.0.0.1:0`, the port read from the process's log) and is stopped by PID on exit, also on
# Ctrl-C. Parts:
#   (a) `kvrouter sim --fixed-ttft-ms 200 --fixed-itl-ms 20`, low load at time scale 1: the bench's
#       TTFT and TPOT against the configured values (bar: within 5%).
#   (b) the same at time scale 10 (sim and bench `--time-scale 10`).
#   (c) 1,000+ concurrent streams (fixed TTFT 100 ms, ITL 50 ms, 200 tokens, 100 req/s, 2,000
#       requests): send lag p50/p95/p99/max (bar: p99 < 1 ms), TTFT/TPOT under that load, the
#       bench's CPU time. With ACC_BASELINE=PATH (an older kvrouter) the same run alternates
#       between the two binaries ACC_ROUNDS times each, for a before/after table.
#   (d) time-scale agreement: one rate point of the demo's workload (multiturn sessions that resend
#       the answers streamed back, 4 simulated workers behind the router, round_robin) with
#       `kvrouter demo` at --time-scale 1 and at the demo's default, same seed (bar: within 10%).
#
# Where the results go:
#   OUT/<run>/         everything a run writes (bench or demo output folder, logs); not kept in git.
#   ACC_RAW/<run>/     the small raw files kept in git, one folder per run (a, b, c_after_N,
#                      c_before_N, d_scale1, d_scaleS): stamp (commit, start and end time, command
#                      lines, configured figures, load average), level.json (the per-level JSON),
#                      cpu (part c: "user sys wall" seconds of the bench), ttft.csv (part d:
#                      uncached prompt tokens and TTFT of each measured request). A part's folders
#                      are replaced only once all its runs succeeded; parts not run keep theirs,
#                      stamps included.
#   ACCURACY_MD        rendered from ACC_RAW only, by bench/scripts/accuracy/accuracy_report.py
#                      (every figure computed from those files; rerun `accuracy_report.py render
#                      ACC_RAW ACCURACY_MD` to check it). The hand-written reading of the
#                      figures lives in bench/results/accuracy/NOTES.md, which this script never
#                      writes.
#
# usage: bench/scripts/accuracy/accuracy.sh [KVROUTER] [OUT] [ACCURACY_MD]
#   KVROUTER     the binary (default build/kvrouter; a RelWithDebInfo build is what the figures use)
#   OUT          working folder (default results/accuracy)
#   ACCURACY_MD  the report (default bench/results/accuracy/REPORT.md)
# Environment (defaults in brackets; the small values in the example finish in about a minute):
#   ACC_PARTS         ["a b c d"] a subset runs only those parts
#   ACC_RAW           [bench/results/accuracy/raw] the kept raw files (above)
#   ACC_BASELINE      an older kvrouter binary to compare in part (c); unset = none
#   ACC_BASELINE_NAME how the table names the baseline (default its path), e.g. "main at 081e968"
#   ACC_ROUNDS        [1]    part (c) runs per binary
#   ACC_AB_PROMPTS    [100]  part (a) requests;  ACC_B_PROMPTS [300] part (b) requests
#   ACC_C_PROMPTS     [2000] part (c) requests;  ACC_C_RATE [100] part (c) req/s
#   ACC_TS_RATE       [4]    part (d) rate, simulated req/s (below round_robin's max SLO rate)
#   ACC_TS_SCALE      [10]   part (d) fast time scale (the demo's default)
#   ACC_D_PROMPTS     [200]  part (d) measured requests at least
#   ACC_D_WARMUP_S    [120]  part (d) simulated seconds of warm-up
#   ACC_D_LEVEL_S     [60]   part (d) simulated seconds measured at least
# e.g. a quick check into scratch folders:
#   ACC_RAW=/tmp/acc/raw ACC_AB_PROMPTS=10 ACC_B_PROMPTS=20 ACC_C_PROMPTS=100 ACC_C_RATE=20 \
#   ACC_D_PROMPTS=20 ACC_D_WARMUP_S=5 ACC_D_LEVEL_S=5 bench/scripts/accuracy/accuracy.sh \
#   build/kvrouter /tmp/acc/out /tmp/acc/ACCURACY.md
set -euo pipefail

KVR=${1:-build/kvrouter}
OUT=${2:-results/accuracy}
MD=${3:-bench/results/accuracy/REPORT.md}
PARTS=${ACC_PARTS:-"a b c d"}
RAW=${ACC_RAW:-bench/results/accuracy/raw}
BASELINE=${ACC_BASELINE:-}
BASELINE_NAME=${ACC_BASELINE_NAME:-$BASELINE}
ROUNDS=${ACC_ROUNDS:-1}
A_PROMPTS=${ACC_AB_PROMPTS:-100}
B_PROMPTS=${ACC_B_PROMPTS:-300}
C_PROMPTS=${ACC_C_PROMPTS:-2000}
C_RATE=${ACC_C_RATE:-100}
TS_RATE=${ACC_TS_RATE:-4}
TS_SCALE=${ACC_TS_SCALE:-10}
D_PROMPTS=${ACC_D_PROMPTS:-200}
D_WARMUP_S=${ACC_D_WARMUP_S:-120}
D_LEVEL_S=${ACC_D_LEVEL_S:-60}
HERE=$(cd "$(dirname "$0")" && pwd)

[ -x "$KVR" ] || { echo "accuracy.sh: $KVR is not an executable (build first)" >&2; exit 2; }
[ -z "$BASELINE" ] || [ -x "$BASELINE" ] || { echo "accuracy.sh: $BASELINE is not an executable" >&2; exit 2; }
command -v python3 >/dev/null || { echo "accuracy.sh: needs python3" >&2; exit 2; }
# the report's first line names this command (bench/scripts/lib/provenance.py)
KVR_REPORT_COMMAND=$(python3 "$HERE/../lib/provenance.py" command --env ACC_ -- bash "$0" "$@")
export KVR_REPORT_COMMAND
mkdir -p "$OUT" "$RAW"
OUT=$(cd "$OUT" && pwd)

PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]+"${PIDS[@]}"}"; do
    kill -TERM "$p" 2>/dev/null || true
  done
  for p in "${PIDS[@]+"${PIDS[@]}"}"; do
    wait "$p" 2>/dev/null || true
  done
  PIDS=()
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The repository's commit when a run starts ("+dirty" when tracked files differ from it).
commit() {
  local rev
  rev=$(git -C "$HERE" rev-parse --short HEAD 2>/dev/null) || { echo unknown; return; }
  [ -z "$(git -C "$HERE" status --porcelain --untracked-files=no 2>/dev/null)" ] || rev="$rev+dirty"
  echo "$rev"
}

now() { date -u +%Y-%m-%dT%H:%M:%SZ; }

# stamp DIR RUN PART KEY=VALUE...: starts DIR/stamp for one run (finish_stamp ends it).
stamp() {
  local dir=$1 run=$2 part=$3 kv
  shift 3
  mkdir -p "$dir"
  {
    echo "run=$run"
    echo "part=$part"
    echo "commit=$(commit)"
    echo "started=$(now)"
    echo "cores=$(nproc)"
    echo "arch=$(uname -m)"
    echo "load=$(uptime | sed 's/.*load average: //')"
    for kv in "$@"; do echo "$kv"; done
  } >"$dir/stamp"
}
finish_stamp() { echo "finished=$(now)" >>"$1/stamp"; }

# start_sim NAME ARGS...: starts `kvrouter sim` on a free loopback port; sets SIM_PID, SIM_PORT and
# SIM_CMD (the command line as recorded in stamps).
start_sim() {
  local name=$1 log
  shift
  log="$OUT/$name.sim.log"
  SIM_CMD="kvrouter sim $*"
  "$KVR" sim --listen 127.0.0.1:0 "$@" >"$log" 2>&1 &
  SIM_PID=$!
  PIDS+=("$SIM_PID")
  SIM_PORT=
  for _ in $(seq 100); do
    SIM_PORT=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9][0-9]*\).*/\1/p' "$log" | head -n 1)
    [ -n "$SIM_PORT" ] && break
    kill -0 "$SIM_PID" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$SIM_PORT" ] || { echo "accuracy.sh: sim $name did not start, see $log" >&2; exit 1; }
}

stop_sim() {
  kill -TERM "$SIM_PID" 2>/dev/null || true
  wait "$SIM_PID" 2>/dev/null || true
  local keep=() p
  for p in "${PIDS[@]}"; do
    [ "$p" = "$SIM_PID" ] || keep+=("$p")
  done
  PIDS=("${keep[@]+"${keep[@]}"}")
}

# bench_fixed DIR KVROUTER ARGS...: one bench run against the sim started last, fixed output
# length OUT_TOKENS; writes "user sys wall" seconds of the bench (bash's `time`) to DIR/cpu and
# appends bench_cmd to DIR/stamp.
bench_fixed() {
  local dir=$1 bin=$2 rc=0
  shift 2
  local args=(--cooldown-s 0 --quiet --output-mean "$OUT_TOKENS" --output-std 0
    --output-min "$OUT_TOKENS" --output-max "$OUT_TOKENS" "$@")
  echo "bench_cmd=kvrouter bench --url URL ${args[*]}" >>"$dir/stamp"
  local TIMEFORMAT='%3U %3S %3R'
  { time "$bin" bench --url "http://127.0.0.1:$SIM_PORT" --out "$dir" "${args[@]}" \
    >"$dir/bench.log" 2>&1; } 2>"$dir/cpu" || rc=$?
  [ "$rc" = 0 ] || { echo "accuracy.sh: bench failed, see $dir/bench.log" >&2; exit 1; }
}

has() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# fixed_part RUN SCALE PROMPTS: part (a) or (b).
fixed_part() {
  local run=$1 scale=$2 prompts=$3 dir="$OUT/$1"
  rm -rf "$dir"
  OUT_TOKENS=100
  start_sim "$run" --fixed-ttft-ms 200 --fixed-itl-ms 20 --time-scale "$scale"
  stamp "$dir" "$run" "$run" binary="$KVR" ttft_ms=200 itl_ms=20 tokens=$OUT_TOKENS rate=4 \
    prompts="$prompts" scale="$scale" sim_cmd="$SIM_CMD"
  bench_fixed "$dir" "$KVR" --rates 4 --num-prompts "$prompts" --time-scale "$scale"
  finish_stamp "$dir"
  stop_sim
  python3 "$HERE/accuracy_report.py" collect "$dir" "$RAW/$run"
}

if has a; then
  echo "accuracy.sh: (a) fixed latency, time scale 1" >&2
  fixed_part a 1 "$A_PROMPTS"
fi

if has b; then
  echo "accuracy.sh: (b) fixed latency, time scale 10" >&2
  fixed_part b 10 "$B_PROMPTS"
fi

if has c; then
  OUT_TOKENS=200
  runs=()
  for round in $(seq "$ROUNDS"); do
    for which in after before; do
      bin=$KVR
      name=$KVR
      if [ "$which" = before ]; then
        [ -n "$BASELINE" ] || continue
        bin=$BASELINE
        name=$BASELINE_NAME
      fi
      echo "accuracy.sh: (c) $C_PROMPTS streams at $C_RATE req/s, $which, round $round" >&2
      run="c_${which}_$round"
      dir="$OUT/$run"
      rm -rf "$dir"
      start_sim "$run" --fixed-ttft-ms 100 --fixed-itl-ms 50 --log-level warn
      stamp "$dir" "$run" c binary="$bin" binary_name="$which: $name" round="$round" \
        ttft_ms=100 itl_ms=50 tokens=$OUT_TOKENS rate="$C_RATE" prompts="$C_PROMPTS" scale=1 \
        sim_cmd="$SIM_CMD"
      bench_fixed "$dir" "$bin" --rates "$C_RATE" --num-prompts "$C_PROMPTS"
      finish_stamp "$dir"
      stop_sim
      runs+=("$run")
    done
  done
  rm -rf "$RAW"/c_after_* "$RAW"/c_before_*
  for run in "${runs[@]}"; do
    python3 "$HERE/accuracy_report.py" collect "$OUT/$run" "$RAW/$run"
  done
fi

if has d; then
  for scale in 1 "$TS_SCALE"; do
    echo "accuracy.sh: (d) demo workload at $TS_RATE req/s, time scale $scale" >&2
    run="d_scale$scale"
    dir="$OUT/$run"
    rm -rf "$dir"
    # --quick only selects a fixed rate list instead of the search; the options after -- replace
    # its rates and level sizes: D_WARMUP_S of warm-up (the sessions reach their turn mix), then at
    # least D_LEVEL_S seconds and D_PROMPTS requests measured.
    args=(demo --quick --time-scale "$scale" --seed 42 --ab round_robin --out "$dir" --
      --rates "$TS_RATE" --num-prompts "$D_PROMPTS" --warmup 0 --warmup-s "$D_WARMUP_S"
      --min-level-s "$D_LEVEL_S" --cooldown-s 0)
    stamp "$dir" "$run" d binary="$KVR" rate="$TS_RATE" scale="$scale" \
      demo_cmd="kvrouter ${args[*]/#$dir/OUT}"
    "$KVR" "${args[@]}" >"$dir/demo.log" 2>&1 &
    demo_pid=$!
    PIDS+=("$demo_pid")
    wait "$demo_pid" || { echo "accuracy.sh: demo failed, see $dir/demo.log" >&2; exit 1; }
    PIDS=()
    finish_stamp "$dir"
  done
  rm -rf "$RAW"/d_scale*
  for scale in 1 "$TS_SCALE"; do
    python3 "$HERE/accuracy_report.py" collect "$OUT/d_scale$scale" "$RAW/d_scale$scale" --requests
  done
fi

python3 "$HERE/accuracy_report.py" render "$RAW" "$MD"
