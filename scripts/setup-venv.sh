#!/usr/bin/env bash
# Idempotent setup of .venv: Python 3.11+ (pyproject's requires-python), a CPU torch 2.13.0 unless a torch is
# already importable by the system Python (then the venv sees it), and Ember
# in editable mode with the extras in EMBER_EXTRAS (default: dev,report). Re-runs only when
# pyproject.toml changes or other extras are asked for.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV=.venv
EXTRAS="${EMBER_EXTRAS:-dev,report}"
STAMP="$VENV/.ember-installed-${EXTRAS//,/-}"
TORCH_CPU_VERSION=2.13.0

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "setup: Ember needs Python 3.11 or newer; $PYTHON is $("$PYTHON" -V 2>&1). Set PYTHON=python3.11 (or newer)." >&2
  exit 1
fi

if [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ] && "$VENV/bin/python" -c "import ember.ps_server, torch" 2>/dev/null; then
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  if "$PYTHON" -c "import torch" 2>/dev/null; then
    echo "setup: using the torch that $PYTHON already has" >&2
    "$PYTHON" -m venv --system-site-packages "$VENV"
  else
    "$PYTHON" -m venv "$VENV"
  fi
fi

pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "setup: installing CPU torch $TORCH_CPU_VERSION" >&2
  pip install "torch==$TORCH_CPU_VERSION"
fi
echo "setup: installing ember-ps with extras $EXTRAS" >&2
pip install -e ".[$EXTRAS]"
touch "$STAMP"
