#!/usr/bin/env bash
# The README's first command: install dependencies, build, and run `kvrouter demo` (4 simulated
# vLLM workers + the router, round-robin vs KV-aware A/B on the multi-turn workload, report in
# results/demo/). Extra arguments go to `kvrouter demo` (e.g. --quick).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(bash deploy/build.sh build)
exec "$bin" demo "$@"
