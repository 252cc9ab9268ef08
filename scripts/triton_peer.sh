#!/usr/bin/env bash
# Triton Inference Server 2.51 (CPU only, Python backend) as a peer to compare frameserve with.
#
#   scripts/triton_peer.sh setup                 # install once into the cache, print the tritonserver path
#   scripts/triton_peer.sh run ARGS...           # set up if needed, then exec tritonserver ARGS...
#   scripts/triton_peer.sh run --model-repository tests/data/triton_repo --http-port 9000 ...
#   scripts/triton_peer.sh python                # print the peer venv's python (numpy < 2)
#
# The nvidia-pytriton 0.7.0 wheel bundles tritonserver 2.51.0 with its Python backend. It runs
# CPU-only on this Debian 12 machine kind once
#   - the Python 3.11 stub (pytriton/tritonserver/python_backend_stubs/3.11/triton_python_backend_stub)
#     is copied into pytriton/tritonserver/backends/python/,
#   - LD_LIBRARY_PATH holds nvidia_pytriton.libs (the wheel's bundled libraries) and libpython's dir,
#   - the stub's `python3` (taken from PATH, run in isolated mode) has numpy < 2: with numpy 2 every
#     Python-model request fails with "output tensor shape does not match size of output".
# So the wheel goes into a venv of its own (it brings numpy 1.26) under $FRAMESERVE_TRITON_CACHE
# (default <repo>/.cache/triton-peer), and `run` puts that venv's bin/ first on PATH.
# Set-up is idempotent: a finished install leaves a stamp file and is reused.
# Exit codes: tritonserver's own; 3 when the peer cannot be installed (no network, no Python 3.11).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cache="${FRAMESERVE_TRITON_CACHE:-$repo/.cache/triton-peer}"
venv="$cache/venv"
PYTRITON_VERSION=0.7.0
stamp="$cache/.installed-$PYTRITON_VERSION"

fail() { echo "triton_peer.sh: $*" >&2; exit 3; }

# The stub is built for CPython 3.11: find an interpreter of that version for the venv.
find_python() {
  local candidate
  for candidate in "${TRITON_PEER_PYTHON:-}" python3.11 "$repo/.venv/bin/python" python3; do
    [[ -n "$candidate" ]] || continue
    command -v "$candidate" >/dev/null 2>&1 || continue
    if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      # a venv's python points back at its base; the base is what the new venv should use
      "$candidate" -c 'import sys, os; print(os.path.join(sys.base_prefix, "bin", "python3.11"))'
      return 0
    fi
  done
  return 1
}

pytriton_dir() { echo "$venv/lib/python3.11/site-packages/pytriton"; }

setup() {
  [[ -f "$stamp" ]] && return 0
  local python
  python="$(find_python)" || fail "no Python 3.11 found (the Triton 2.51 Python backend stub needs 3.11)"
  mkdir -p "$cache"
  # one installer at a time (two test runs may start at once); the second finds the stamp
  exec 9>"$cache/.lock"
  command -v flock >/dev/null 2>&1 && flock 9
  [[ -f "$stamp" ]] && return 0
  if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv" || fail "cannot create a venv with $python"
  fi
  "$venv/bin/python" -m pip install --disable-pip-version-check -q "nvidia-pytriton==$PYTRITON_VERSION" >&2 \
    || fail "cannot install nvidia-pytriton==$PYTRITON_VERSION (no network?)"
  "$venv/bin/python" -c 'import numpy, sys; sys.exit(int(numpy.__version__.split(".")[0]) >= 2)' \
    || "$venv/bin/python" -m pip install --disable-pip-version-check -q "numpy<2" >&2 \
    || fail "cannot install numpy < 2 into the peer venv"
  local pt
  pt="$(pytriton_dir)"
  [[ -x "$pt/tritonserver/bin/tritonserver" ]] || fail "no tritonserver in the nvidia-pytriton wheel ($pt)"
  local stub="$pt/tritonserver/python_backend_stubs/3.11/triton_python_backend_stub"
  [[ -f "$stub" ]] || fail "no Python 3.11 backend stub in the wheel ($stub)"
  cp "$stub" "$pt/tritonserver/backends/python/triton_python_backend_stub"
  chmod +x "$pt/tritonserver/backends/python/triton_python_backend_stub"
  touch "$stamp"
}

libpython_dir() {
  "$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))'
}

cmd="${1:-setup}"
[[ $# -gt 0 ]] && shift
case "$cmd" in
  setup)
    setup
    echo "$(pytriton_dir)/tritonserver/bin/tritonserver"
    ;;
  python)
    setup
    echo "$venv/bin/python"
    ;;
  run)
    setup
    pt="$(pytriton_dir)"
    export PATH="$venv/bin:$PATH"
    export LD_LIBRARY_PATH="$venv/lib/python3.11/site-packages/nvidia_pytriton.libs:$(libpython_dir):$pt/tritonserver/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    # the stub runs `python3 -I`: PYTHONPATH and the like are ignored there; unset them here too
    unset PYTHONPATH PYTHONHOME VIRTUAL_ENV
    exec "$pt/tritonserver/bin/tritonserver" --backend-directory "$pt/tritonserver/backends" "$@"
    ;;
  *)
    echo "usage: $0 setup | python | run TRITONSERVER-ARGS..." >&2
    exit 2
    ;;
esac
