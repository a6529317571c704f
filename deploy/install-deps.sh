#!/usr/bin/env bash
# Installs what kvrouter needs on Debian 12, in one of two modes:
#   install-deps.sh               build and test (the default, deploy/run-tests.sh's): Debian's own
#                                 packages (BUILD_PACKAGES + TEST_PACKAGES, and NODE_PACKAGES unless
#                                 a node with npm is already there), then the npm packages of
#                                 tests/deploy/package-lock.json (the Kubernetes schema check,
#                                 tests/deploy/test_k8s_schema.mjs) into tests/deploy/node_modules
#                                 and those of tests/sdk/package-lock.json (the OpenAI and Anthropic
#                                 SDKs, tests/sdk/test_sdk_clients.mjs) into tests/sdk/node_modules.
#   install-deps.sh --build-only  what `cmake -DBUILD_TESTING=OFF` and `cmake --build --target
#                                 kvrouter` need (BUILD_PACKAGES): the compiler, CMake, pkg-config
#                                 and the -dev libraries; no cmocka, browser, fuzzing toolchain,
#                                 Python or npm. The image's build stage (deploy/k8s/Dockerfile).
#   --list                        (with either mode) print that mode's Debian packages, one a
#                                 line, and exit without installing anything.
# Idempotent: packages already present are not fetched again, `apt-get update` runs only when
# something is missing, and `npm ci` only when the lockfile changed since the last install. Needs
# root (or sudo) for apt-get. An unknown flag is one line on stderr and exit status 2.
set -euo pipefail

# The build: compiler, CMake, pkg-config, and the libraries CMakeLists.txt finds with
# pkg_check_modules (libuv, libcurl, xxhash, cJSON, ZeroMQ, msgpack-c) plus node-llhttp, whose C
# sources (/usr/share/llhttp) the build compiles.
BUILD_PACKAGES=(build-essential cmake pkg-config libuv1-dev node-llhttp libcurl4-openssl-dev
                libxxhash-dev libcjson-dev libzmq3-dev libmsgpack-dev)
# The tests, on top of the build: cmocka (tests/CMakeLists.txt, the unit tests), Python and its
# modules (the integration tests and tests/deploy/), curl, clang-format (the format check of
# deploy/run-tests.sh). clang and libclang-rt-14-dev (libFuzzer, clang's sanitizer runtimes): the
# fuzz stage of deploy/run-tests.sh (tests/fuzz/, -DKVR_FUZZ=ON); Debian 12's clang is clang-14.
# chromium, chromium-driver and python3-selenium: the admin dashboard in a headless browser
# (tests/router/test_dashboard.py).
TEST_PACKAGES=(libcmocka-dev python3 python3-yaml python3-zmq python3-msgpack curl clang-format
               clang libclang-rt-14-dev chromium chromium-driver python3-selenium)
# Node.js and npm (the schema check): Debian's, unless the machine already has a node with npm (a
# nodejs package from another source bundles npm, and Debian's npm would conflict with it).
NODE_PACKAGES=(nodejs npm)

build_only=0
list=0
for arg in "$@"; do
  case "$arg" in
    --build-only) build_only=1 ;;
    --list) list=1 ;;
    *)
      echo "install-deps.sh: unknown flag '$arg' (valid: --build-only, --list)" >&2
      exit 2
      ;;
  esac
done

if [ "$build_only" -eq 1 ]; then
  PACKAGES=("${BUILD_PACKAGES[@]}")
else
  PACKAGES=("${BUILD_PACKAGES[@]}" "${TEST_PACKAGES[@]}")
fi

if [ "$list" -eq 1 ]; then
  printf '%s\n' "${PACKAGES[@]}"
  if [ "$build_only" -eq 0 ]; then
    printf '%s\n' "${NODE_PACKAGES[@]}"
  fi
  exit 0
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "$build_only" -eq 0 ]; then
  command -v npm >/dev/null 2>&1 || missing+=("${NODE_PACKAGES[@]}")
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ "$build_only" -eq 1 ]; then
  exit 0
fi

# The npm packages of the schema check (tests/deploy) and of the SDK clients test (tests/sdk),
# exactly as locked. The copy of the lockfile kept in node_modules says what is installed there.
for folder in deploy sdk; do
  npm_tests="$(cd "$(dirname "$0")/../tests/$folder" && pwd)"
  if ! cmp -s "$npm_tests/package-lock.json" "$npm_tests/node_modules/.kvr-package-lock.json"; then
    echo "install-deps: npm ci in tests/$folder" >&2
    (cd "$npm_tests" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    cp "$npm_tests/package-lock.json" "$npm_tests/node_modules/.kvr-package-lock.json"
  fi
done
