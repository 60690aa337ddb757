#!/usr/bin/env bash
# Install Prometheus from Debian's package when it is missing and we are root (setup.sh runs this). The package's
# service is not started (policy-rc.d denies it during the install; nothing enables it here): the dashboard test
# starts its own Prometheus on a free port with a temporary config and data directory.
set -euo pipefail
if command -v prometheus >/dev/null 2>&1; then
  echo "prometheus: $(command -v prometheus)"
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "prometheus is missing; as root on Debian/Ubuntu: apt-get install prometheus (tests/test_dashboard.py needs it)" >&2
  exit 0
fi
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && created_policy=1
fi
trap 'if [ "$created_policy" = 1 ]; then rm -f "$policy"; fi' EXIT
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus
# On a machine run by systemd the package enables its unit: keep it from starting at the next boot, too.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
echo "prometheus: $(command -v prometheus) (not started)"
