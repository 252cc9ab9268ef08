#!/usr/bin/env bash
# Set up the test environment (.venv with the dev extras) and run the whole test suite.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/unit -x).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev
# Real sample models and videos are fetched once into this folder (see tests/conftest.py).
export FRAMESERVE_TEST_HOME=${FRAMESERVE_TEST_HOME:-$PWD/.test-home}
exec .venv/bin/python -m pytest "${@:-tests}"
