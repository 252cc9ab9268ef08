#!/usr/bin/env bash
# The static gates CI runs before the tests (.ci/run): ruff over src/, and mypy --strict on the
# base layers, the service, the scheduler and the transports (configured in pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev
.venv/bin/ruff check src
.venv/bin/mypy -p frameserve.types -p frameserve.errors -p frameserve.request -p frameserve.shm -p frameserve.service \
    -p frameserve.scheduler -p frameserve.protocol
