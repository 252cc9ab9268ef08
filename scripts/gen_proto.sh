#!/usr/bin/env bash
# Regenerate frameserve's protobuf / gRPC Python modules from src/frameserve/_proto/*.proto
# with grpcio-tools (in the project's .venv, or the python given as $PYTHON).
#
# Post-processing, so the generated code lives inside the frameserve package:
#  - the unused experimental helper class at the end of *_pb2_grpc.py is dropped;
#  - imports between generated modules are made package-relative (`from . import x_pb2`);
#  - descriptors go into frameserve's own descriptor pool (frameserve._proto._pool.POOL), not
#    protobuf's default pool, because our files reuse Triton's package and message names
#    (`inference.ModelConfig`, ...) for wire compatibility and would otherwise clash with
#    tritonclient's generated modules when both are imported in one process.
set -euo pipefail
shopt -s nullglob
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
dir=src/frameserve/_proto
protos=($(cd "$dir" && ls *.proto))
"$PYTHON" -m grpc_tools.protoc -I "$dir" \
  --python_out="$dir" --pyi_out="$dir" --grpc_python_out="$dir" "${protos[@]/#/$dir/}"
# grpc_python_out writes an (empty) *_pb2_grpc.py for message-only files; keep only the service's.
rm -f "$dir/model_config_pb2_grpc.py"
# Drop the trailing "EXPERIMENTAL API" class (stub-less static call helpers, 500+ lines we never use);
# the stub, the servicer base class and add_..._to_server stay.
sed -i '/^ *# This class is part of an EXPERIMENTAL API\./,$d' "$dir/grpc_service_pb2_grpc.py"
for f in "$dir"/*_pb2.py "$dir"/*_pb2_grpc.py "$dir"/*_pb2.pyi; do
  sed -i -E \
    -e 's/^import ([a-z_]+_pb2) as /from . import \1 as /' \
    -e 's/^from ([a-z_]+_pb2) import /from .\1 import /' \
    -e 's/_descriptor_pool\.Default\(\)\.AddSerializedFile/_POOL.AddSerializedFile/' \
    "$f"
  if grep -q '_POOL.AddSerializedFile' "$f"; then
    sed -i -E '0,/^from google\.protobuf import symbol_database/s//from ._pool import POOL as _POOL\n&/' "$f"
  fi
done
echo "generated: $(cd "$dir" && ls *_pb2*.py *.pyi | tr '\n' ' ')"
