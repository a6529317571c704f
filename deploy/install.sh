#!/usr/bin/env bash
# Installs kvrouter as a system service on Debian 12: builds, installs the binary to
# /usr/local/bin, a config to /etc/kvrouter/config.json (kept if present), a `kvrouter` system user,
# and the systemd unit. Start with: systemctl enable --now kvrouter
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(bash deploy/build.sh build)
install -m 0755 "$bin" /usr/local/bin/kvrouter
install -d -m 0755 /etc/kvrouter
if [ ! -f /etc/kvrouter/config.json ]; then
  install -m 0644 deploy/config.example.json /etc/kvrouter/config.json
fi
id kvrouter >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin kvrouter
install -m 0644 deploy/kvrouter.service /etc/systemd/system/kvrouter.service
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
fi
echo "installed /usr/local/bin/kvrouter; edit /etc/kvrouter/config.json, then: systemctl enable --now kvrouter"
