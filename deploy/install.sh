#!/usr/bin/env bash
# Installs kvrouter as a system service on Debian 12: builds, installs the binary to
# /usr/local/bin, a config to /etc/kvrouter/config.json (kept if present), the admin API's bearer
# token in /etc/kvrouter/admin-token (root-only, generated if absent; the unit passes it to the
# service with LoadCredential=), and the systemd unit (DynamicUser: no system user is created).
# Start with: systemctl enable --now kvrouter
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(bash deploy/build.sh build)
install -m 0755 "$bin" /usr/local/bin/kvrouter
install -d -m 0755 /etc/kvrouter
if [ ! -f /etc/kvrouter/config.json ]; then
  install -m 0644 deploy/config.example.json /etc/kvrouter/config.json
fi
if [ ! -f /etc/kvrouter/admin-token ]; then
  (umask 077 && head -c 32 /dev/urandom | base64 | tr -d '\n' > /etc/kvrouter/admin-token)
fi
install -m 0644 deploy/kvrouter.service /etc/systemd/system/kvrouter.service
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
fi
echo "installed /usr/local/bin/kvrouter; admin token in /etc/kvrouter/admin-token; edit /etc/kvrouter/config.json, then: systemctl enable --now kvrouter"
