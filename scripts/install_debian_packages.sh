#!/usr/bin/env bash
# Install the Debian packages the tests start for real, when missing and we are root (setup.sh runs this):
#   prometheus    tests/test_dashboard.py (its own Prometheus on a free port, temporary config and data)
#   redis-server  tests/routing/test_shared_inflight.py, tests/test_proxy_replicas.py (a server on a free port)
#   tmux          tests/observability/test_top.py (the real terminal `litellm-disagg top` runs in)
# No package's service is started (policy-rc.d denies it during the install) or enabled: each test starts its own.
set -euo pipefail
declare -A command_of=([prometheus]=prometheus [redis-server]=redis-server [tmux]=tmux)
missing=()
for package in prometheus redis-server tmux; do
  if command -v "${command_of[$package]}" >/dev/null 2>&1; then
    echo "$package: $(command -v "${command_of[$package]}")"
  else
    missing+=("$package")
  fi
done
if [ "${#missing[@]}" = 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "missing: ${missing[*]}; as root on Debian/Ubuntu: apt-get install ${missing[*]} (the tests that start them are skipped, and fail under CI)" >&2
  exit 0
fi
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && created_policy=1
fi
trap 'if [ "$created_policy" = 1 ]; then rm -f "$policy"; fi' EXIT
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
# On a machine run by systemd the packages enable their units: keep them from starting at the next boot, too.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  for unit in prometheus redis-server; do
    systemctl disable --now "$unit" >/dev/null 2>&1 || true
  done
fi
echo "installed (not started): ${missing[*]}"
