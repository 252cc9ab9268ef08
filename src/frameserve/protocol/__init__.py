"""Wire formats and routes: the only frameserve code that imports FastAPI and grpc.

- :mod:`frameserve.protocol.http` — the Open Inference Protocol ("KServe v2") over HTTP/REST with
  Triton's extensions (binary tensor data, model repository, statistics, model configuration).
- ``frameserve.protocol.grpc`` — the same protocol over gRPC (``inference.GRPCInferenceService``).

Each decodes its wire format, calls the transport-neutral
:class:`frameserve.service.InferenceService`, and encodes the answer; neither knows a backend.
This package imports nothing itself, so importing one transport never loads the other.
"""
