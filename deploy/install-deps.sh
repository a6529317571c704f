#!/usr/bin/env bash
# Installs what kvrouter needs to build and test on Debian 12, from Debian's own packages only.
# Idempotent: packages already present are not fetched again, and `apt-get update` runs only when
# something is missing. Needs root (or sudo).
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
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
