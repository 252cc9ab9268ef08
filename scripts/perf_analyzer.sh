#!/usr/bin/env bash
# Run Triton's perf_analyzer (from the tritonclient 2.51.0 wheel) with the given arguments.
#
#   scripts/perf_analyzer.sh -m MODEL -u localhost:8000 --concurrency-range 1:4
#   scripts/perf_analyzer.sh --fetch-only      # fetch into the cache and print the binary's path
#
# The PyPI `perf-analyzer` package is an empty placeholder; the binary ships inside the
# tritonclient 2.51.0 manylinux x86_64 wheel (later releases need glibc 2.38). It needs two
# shared libraries that are not on a stock Debian 12 machine:
#   libb64.so.0d     from the Debian package libb64-0d (apt-get download + dpkg -x, no install)
#   libcudart.so.12  from the nvidia-cuda-runtime-cu12 wheel (no GPU is needed at run time)
# Everything is fetched once into $FRAMESERVE_PA_CACHE (default <repo>/.cache/perf_analyzer) and
# reused; tritonclient 2.51 is never installed (it pins numpy < 2 and protobuf < 5).
# Exit codes: perf_analyzer's own; 3 when the binary or its libraries cannot be fetched.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cache="${FRAMESERVE_PA_CACHE:-$repo/.cache/perf_analyzer}"
PYTHON="${PYTHON:-$( [[ -x "$repo/.venv/bin/python" ]] && echo "$repo/.venv/bin/python" || echo python3 )}"
TRITONCLIENT_VERSION=2.51.0

fail() { echo "perf_analyzer.sh: $*" >&2; exit 3; }

fetch() {
  mkdir -p "$cache/bin" "$cache/lib"
  local tmp
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' RETURN
  if [[ ! -x "$cache/bin/perf_analyzer" ]]; then
    "$PYTHON" -m pip download --disable-pip-version-check -q --no-deps --only-binary=:all: \
      --platform manylinux1_x86_64 --python-version 3.11 --implementation py \
      "tritonclient==$TRITONCLIENT_VERSION" -d "$tmp" >&2 \
      || fail "cannot download the tritonclient $TRITONCLIENT_VERSION wheel (no network?)"
    unzip -q -o -j "$tmp"/tritonclient-*.whl "tritonclient-$TRITONCLIENT_VERSION.data/data/bin/perf_analyzer" -d "$tmp" \
      || fail "no bin/perf_analyzer in the tritonclient wheel"
    chmod +x "$tmp/perf_analyzer"
    mv "$tmp/perf_analyzer" "$cache/bin/perf_analyzer"
  fi
  if [[ ! -f "$cache/lib/libcudart.so.12" ]]; then
    "$PYTHON" -m pip download --disable-pip-version-check -q --no-deps --only-binary=:all: \
      --platform manylinux2014_x86_64 --python-version 3.11 --implementation py \
      "nvidia-cuda-runtime-cu12" -d "$tmp" >&2 \
      || fail "cannot download the nvidia-cuda-runtime-cu12 wheel (no network?)"
    unzip -q -o -j "$tmp"/nvidia_cuda_runtime_cu12-*.whl "nvidia/cuda_runtime/lib/libcudart.so.12" -d "$cache/lib" \
      || fail "no libcudart.so.12 in the nvidia-cuda-runtime-cu12 wheel"
  fi
  if [[ ! -f "$cache/lib/libb64.so.0d" ]]; then
    # a new machine may have no package lists yet: refresh them once and retry
    (cd "$tmp" && apt-get download libb64-0d >/dev/null 2>&1) \
      || { apt-get update -qq >/dev/null 2>&1 && (cd "$tmp" && apt-get download libb64-0d >/dev/null 2>&1); } \
      || fail "cannot download the Debian package libb64-0d (no network or no apt?)"
    dpkg -x "$tmp"/libb64-0d_*.deb "$tmp/deb" || fail "cannot unpack libb64-0d"
    cp "$(find "$tmp/deb" -name 'libb64.so.0d*' | head -n1)" "$cache/lib/libb64.so.0d" \
      || fail "no libb64.so.0d in the libb64-0d package"
  fi
}

[[ -x "$cache/bin/perf_analyzer" && -f "$cache/lib/libcudart.so.12" && -f "$cache/lib/libb64.so.0d" ]] || fetch

if [[ "${1:-}" == "--fetch-only" ]]; then
  echo "$cache/bin/perf_analyzer"
  exit 0
fi
export LD_LIBRARY_PATH="$cache/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$cache/bin/perf_analyzer" "$@"
