#!/usr/bin/env bash
# Installs what kvrouter needs to build and test on Debian 12: Debian's own packages, then the npm
# packages of tests/deploy/package-lock.json (the Kubernetes schema check, tests/deploy/
# test_k8s_schema.mjs) into tests/deploy/node_modules. Idempotent: packages already present are not
# fetched again, `apt-get update` runs only when something is missing, and `npm ci` only when the
# lockfile changed since the last install. Needs root (or sudo) for apt-get.
set -euo pipefail

# clang and libclang-rt-14-dev (libFuzzer, clang's sanitizer runtimes): the fuzz stage of
# deploy/run-tests.sh (tests/fuzz/, -DKVR_FUZZ=ON). Debian 12's clang is clang-14.
# chromium, chromium-driver and python3-selenium: the admin dashboard in a headless browser
# (tests/router/test_dashboard.py).
PACKAGES=(build-essential cmake pkg-config libuv1-dev node-llhttp libcurl4-openssl-dev
          libxxhash-dev libcjson-dev libcmocka-dev libzmq3-dev libmsgpack-dev python3 python3-yaml
          python3-zmq python3-msgpack curl clang-format clang libclang-rt-14-dev
          chromium chromium-driver python3-selenium)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm: Debian's, unless the machine already has a node with npm (a nodejs package
# from another source bundles npm, and Debian's npm would conflict with it).
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
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

# The schema check's npm packages, exactly as locked. The copy of the lockfile kept in
# node_modules says what is installed there.
deploy_tests="$(cd "$(dirname "$0")/../tests/deploy" && pwd)"
if ! cmp -s "$deploy_tests/package-lock.json" "$deploy_tests/node_modules/.kvr-package-lock.json"; then
  echo "install-deps: npm ci in tests/deploy" >&2
  (cd "$deploy_tests" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  cp "$deploy_tests/package-lock.json" "$deploy_tests/node_modules/.kvr-package-lock.json"
fi
