#!/usr/bin/env bash
# The static gates CI runs before the tests (.ci/run): ruff over src/, tests/ and bench/, and mypy --strict over the
# whole package (pyproject.toml's [tool.mypy]; protoc's generated modules excluded there).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
.venv/bin/mypy -p frameserve
