#!/usr/bin/env bash
# Set up frameserve in a virtual environment at <repo>/.venv.
#   scripts/setup.sh          the package with the OpenVINO extra (what `frameserve run` needs)
#   scripts/setup.sh --dev    plus everything the test suite needs (pytest, onnx, nudenet, ...),
#                             and torch==2.13.0 (a CPU build) for the torch backend's tests
# Honours PYTHON (default: python3, which must be 3.11 or newer). Re-running is cheap.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
extras="openvino"
[[ "${1:-}" == "--dev" ]] && extras="openvino,dev"

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "frameserve needs Python >= 3.11; $PYTHON is $("$PYTHON" -V 2>&1)" >&2
  exit 2
fi
[[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
stamp=".venv/.frameserve-$extras-$(cat pyproject.toml | sha256sum | cut -c1-16)"
if [[ ! -f "$stamp" ]]; then
  # torch first, pinned: the `torch` extra says only torch>=2.3, and a plain `torch` would pull
  # a multi-GB CUDA build; this exact version is a CPU build.
  if [[ "$extras" == *dev* ]]; then
    .venv/bin/python -m pip install --disable-pip-version-check -q torch==2.13.0
  fi
  .venv/bin/python -m pip install --disable-pip-version-check -q -e ".[$extras]"
  touch "$stamp"
fi
