#!/usr/bin/env bash
# The static gates CI runs before the tests (.ci/run): ruff over src/, and mypy --strict on the
# modules listed in pyproject.toml's strict override (issue 25 widens it to the whole package).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev
.venv/bin/ruff check src
.venv/bin/mypy -p frameserve.types -p frameserve.errors -p frameserve.request -p frameserve.shm -p frameserve.service \
    -p frameserve.scheduler -p frameserve.protocol -m frameserve.config -m frameserve.cgroup -m frameserve.metrics \
    -m frameserve._memory -m frameserve._ipc -m frameserve.pb_utils -p frameserve.assets -p frameserve.repository \
    -p frameserve.backends -p frameserve.security -p frameserve.video -p frameserve.pipeline -m frameserve.cli.run -m frameserve.cli.frames
