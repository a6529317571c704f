#!/usr/bin/env bash
# The README's second command: install dependencies, then build and run the whole test suite twice,
# once in a normal build and once under AddressSanitizer + UndefinedBehaviorSanitizer, then a short
# libFuzzer smoke of every fuzz target over its seed corpus (clang, -DKVR_FUZZ=ON, tests/fuzz/).
# Unit tests (cmocka) and integration tests (real processes on 127.0.0.1) both run through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
jobs=$(nproc)

echo "== format (clang-format --dry-run -Werror, .clang-format)"
find router src policies bench tests -name '*.[ch]' -print0 | xargs -0 -r clang-format --dry-run -Werror \
  || { echo "format: run  find router src policies bench tests -name '*.[ch]' | xargs clang-format -i" >&2
       exit 1; }

echo "== house rules (.ci/: includes only go down the layers; only src/core/router*.c writes router state)"
python3 .ci/check_layers.py
python3 .ci/check_writers.py

echo "== build (RelWithDebInfo)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$jobs" >/dev/null
echo "== tests"
ctest --test-dir build --output-on-failure -j"$jobs" --timeout 600

echo "== build (ASan+UBSan)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVR_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$jobs" >/dev/null
echo "== tests under ASan+UBSan"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
KVR_SANITIZED=1 ctest --test-dir build-asan --output-on-failure -j"$jobs" --timeout 900

echo "== build (clang, libFuzzer + ASan+UBSan)"
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVR_FUZZ=ON >/dev/null
cmake --build build-fuzz -j"$jobs" --target fuzz_all >/dev/null
echo "== fuzz smokes (long runs: bench/scripts/fuzz/fuzz.sh all)"
ctest --test-dir build-fuzz -L fuzz --output-on-failure -j"$jobs" --timeout 300
