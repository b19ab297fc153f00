#!/bin/sh
# The image's install steps (docker/Dockerfile runs them; tests/e2e/test_install.py runs
# them too, in a fresh virtual environment, so a broken image step fails CI).
#   install.sh torch   CPU torch 2.13.0, from TORCH_INDEX_URL when set (pip's own index else)
#   install.sh ember   Ember built as a wheel from the current directory and installed,
#                      then its native ops built, required (a failed build fails the step)
set -eu
case "${1:-}" in
  torch)
    pip install "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
    ;;
  ember)
    wheels="$(mktemp -d)"
    pip wheel --no-deps --wheel-dir "$wheels" .
    pip install "$wheels"/ember_ps-*.whl
    rm -rf "$wheels"
    EMBER_KERNELS=native ember doctor
    ;;
  *)
    echo "usage: install.sh torch|ember" >&2
    exit 2
    ;;
esac
