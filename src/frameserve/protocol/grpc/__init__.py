"""The Open Inference Protocol over gRPC: ``inference.GRPCInferenceService``, wire-compatible
with Triton's (tritonclient, perf_analyzer), plus the standard ``grpc.health.v1`` service.

- :func:`create_server` builds the (thread-pool) gRPC server for an
  :class:`~frameserve.service.InferenceService`; :func:`bound_port` gives its port.
- :class:`GrpcInferenceServicer` is the servicer (decode -> service -> encode).
- :func:`decode_infer_request` / :func:`encode_infer_response` are the tensor codecs.
"""

from frameserve.protocol.grpc._codec import decode_infer_request, encode_infer_response
from frameserve.protocol.grpc._server import DEFAULT_MAX_MESSAGE_BYTES, HealthServicer, bound_port, create_server
from frameserve.protocol.grpc._servicer import GrpcInferenceServicer, config_message

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "GrpcInferenceServicer",
    "HealthServicer",
    "bound_port",
    "config_message",
    "create_server",
    "decode_infer_request",
    "encode_infer_response",
]
