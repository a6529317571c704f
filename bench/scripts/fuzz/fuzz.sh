#!/usr/bin/env bash
# fuzz.sh -- long libFuzzer runs of the targets in tests/fuzz/ (the CTest smokes run seconds only).
#
# Experiment fuzz: do the parsers survive hours of libFuzzer? Writes nothing in the repository (the
# corpora and crash inputs go to FUZZ_SCRATCH and FUZZ_ARTIFACTS, below) and keeps no
# bench/results/ folder: it prints each target's figures and exits 1 on a crash.
#
# Builds FUZZ_BUILD (CC=clang, -DKVR_FUZZ=ON: every object under ASan+UBSan with fuzzer coverage)
# (FUZZ_NO_BUILD=1 skips it), then runs each target over a scratch corpus outside the repo, seeded
# from tests/fuzz/corpus/<x>/ and kept between runs, so each run starts from what the last one
# found; tests/fuzz/<x>.dict, when there is one, is its libFuzzer dictionary. Inputs that crash
# land in ARTIFACTS/<x>/crash-<sha1> (or leak-, timeout-, oom-); the repo is never written. At the
# end it prints, per target, executions, exec/s, corpus size and the crash files found by this run,
# and exits 1 if any target crashed.
#
# usage: bench/scripts/fuzz/fuzz.sh TARGET|all [SECONDS | -runs=N]
#   TARGET   openai, sse, prom, config, http_request (whichever build-fuzz has), or all
#   SECONDS  time per target (default 600); -runs=N stops each target after N executions instead
#            (e.g. -runs=10000000)
# Environment:
#   FUZZ_BUILD      build dir (default build-fuzz); FUZZ_NO_BUILD=1 skips configure and build
#   FUZZ_SCRATCH    scratch corpora (default ${TMPDIR:-/tmp}/kvrouter-fuzz/corpus/<x>)
#   FUZZ_ARTIFACTS  crash inputs (default ${TMPDIR:-/tmp}/kvrouter-fuzz/artifacts/<x>)
#   FUZZ_JOBS       parallel fuzzing processes per target (libFuzzer -fork=N; default 1)
#   FUZZ_ARGS       extra libFuzzer flags (e.g. "-max_len=8192 -dict=...")
# Reproduce a crash: build-fuzz/tests/fuzz_<x> ARTIFACTS/<x>/crash-<sha1>   (tests/fuzz/README.md)
set -euo pipefail
cd "$(dirname "$0")/../../.."

if [ $# -lt 1 ]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
fi
which="$1"
limit="${2:-600}"
case "$limit" in
  -runs=[0-9]*) bound=("$limit") ;;
  [0-9]*) bound=(-max_total_time="$limit") ;;
  *) echo "fuzz.sh: the second argument must be SECONDS or -runs=N, not '$limit'" >&2; exit 2 ;;
esac
build="${FUZZ_BUILD:-build-fuzz}"
root="${TMPDIR:-/tmp}/kvrouter-fuzz"
scratch="${FUZZ_SCRATCH:-$root/corpus}"
artifacts="${FUZZ_ARTIFACTS:-$root/artifacts}"
jobs="${FUZZ_JOBS:-1}"

if [ "${FUZZ_NO_BUILD:-0}" != 1 ]; then
  CC=clang cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVR_FUZZ=ON >/dev/null
  cmake --build "$build" -j"$(nproc)" --target fuzz_all >/dev/null
fi

targets=()
for f in tests/fuzz/fuzz_*.c; do
  t="$(basename "$f" .c)"
  t="${t#fuzz_}"
  if [ "$which" = all ] || [ "$which" = "$t" ]; then
    [ -x "$build/tests/fuzz_$t" ] || { echo "fuzz.sh: $build/tests/fuzz_$t not built" >&2; exit 1; }
    targets+=("$t")
  fi
done
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz.sh: no target '$which' (have: $(ls tests/fuzz/fuzz_*.c | sed 's,.*/fuzz_,,; s,\.c$,,' | tr '\n' ' '))" >&2
  exit 2
fi

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
# Inputs libFuzzer saved as failing (crash-, leak-, timeout-, oom-, slow-unit-<sha1>) in dir $1.
count_crashes() {
  ls "$1" | grep -cE '^(crash|leak|timeout|oom|slow-unit)-' || true
}
summary=()
failed=0
for t in "${targets[@]}"; do
  mkdir -p "$scratch/$t" "$artifacts/$t"
  if [ -d "tests/fuzz/corpus/$t" ]; then
    cp -n tests/fuzz/corpus/"$t"/* "$scratch/$t/" 2>/dev/null || true
  fi
  before="$(count_crashes "$artifacts/$t")"
  log="$artifacts/$t/last-run.log"
  dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  fork=()
  [ "$jobs" -gt 1 ] && fork=(-fork="$jobs" -ignore_crashes=1)
  echo "== fuzz_$t ${bound[*]} (corpus $scratch/$t, log $log)"
  rc=0
  # shellcheck disable=SC2086
  "$build/tests/fuzz_$t" "${bound[@]}" "${dict[@]}" "${fork[@]}" -artifact_prefix="$artifacts/$t/" \
    -print_final_stats=1 ${FUZZ_ARGS:-} "$scratch/$t" >"$log" 2>&1 || rc=$?
  execs="$(grep -E '^stat::number_of_executed_units' "$log" | tail -1 | awk '{print $2}')"
  rate="$(grep -E '^stat::average_exec_per_sec' "$log" | tail -1 | awk '{print $2}')"
  if [ -z "$execs" ]; then # -fork mode prints no final stats: the last status line has them
    execs="$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')"
    rate="$(grep -oE 'exec/s: [0-9]+' "$log" | tail -1 | awk '{print $2}')"
  fi
  crashes="$(count_crashes "$artifacts/$t")"
  [ "$rc" -ne 0 ] && failed=1
  new=$((crashes - before))
  size="$(ls "$scratch/$t" | wc -l)"
  line="$(printf '%-14s executions %-12s exec/s %-8s corpus %-6s exit %-3s crash files %s, %s new' \
    "fuzz_$t" "${execs:-?}" "${rate:-?}" "$size" "$rc" "$crashes" "$new")"
  summary+=("$line")
  if [ "$rc" -ne 0 ]; then
    grep -E 'ERROR|invariant failed|runtime error|SUMMARY' "$log" | head -5 >&2 || true
  fi
done
echo "== summary (artifacts in $artifacts)"
printf '%s\n' "${summary[@]}"
exit "$failed"
