#!/usr/bin/env bash
# Make docker-compose available so the tests validate docker/compose.yaml (no daemon
# needed: `docker-compose config` only reads the file). Debian's package when running as
# root with apt-get; otherwise the test skips, saying why.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/apt-install.sh

if ! apt_install docker-compose docker-compose; then
  echo "setup: docker-compose not installed; the compose file test will skip" >&2
fi
