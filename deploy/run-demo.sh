#!/usr/bin/env bash
# The README's first command: install dependencies, build, and run `kvrouter demo` (the policy
# study in virtual time, then round-robin vs KV-aware on the multi-turn workload confirmed in real
# time on 4 simulated vLLM workers + the router, and how well the two agree; results in
# results/demo/). Extra arguments go to `kvrouter demo` (e.g. --quick).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(bash deploy/build.sh build)
exec "$bin" demo "$@"
