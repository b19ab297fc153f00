#!/usr/bin/env bash
# Make docker-compose available so the tests validate docker/compose.yaml (no daemon
# needed: `docker-compose config` only reads the file). Debian's package when running as
# root with apt-get; otherwise the test skips, saying why.
set -euo pipefail

if command -v docker-compose >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing docker-compose (apt-get)" >&2
  if DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-compose >/dev/null 2>&1 ||
     { apt-get update -q >/dev/null 2>&1 &&
       DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-compose >/dev/null 2>&1; }; then
    exit 0
  fi
fi
echo "setup: docker-compose not installed; the compose file test will skip" >&2
