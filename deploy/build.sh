#!/usr/bin/env bash
# Builds kvrouter into build/ (or $1): installs dependencies first, then CMake + make.
# Usage: deploy/build.sh [BUILD_DIR] [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
dir="${1:-build}"
shift || true
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)" >/dev/null
echo "$dir/kvrouter"
