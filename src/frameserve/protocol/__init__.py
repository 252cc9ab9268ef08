"""Wire formats and routes: the only frameserve code that imports FastAPI and grpc.

- :mod:`frameserve.protocol.http` — the Open Inference Protocol ("KServe v2") over HTTP/REST with
  Triton's extensions (binary tensor data, model repository, statistics, model configuration).
- ``frameserve.protocol.grpc`` — the same protocol over gRPC (``inference.GRPCInferenceService``).

Each decodes its wire format, calls the transport-neutral
:class:`frameserve.service.InferenceService`, and encodes the answer; neither knows a backend.
This package imports nothing itself, so importing one transport never loads the other.
"""

RUN_HERE_UNDER_US = 300
"""The transports' dispatch policy (``service.client(inline_under_us=RUN_HERE_UNDER_US)``, made
once by each transport): a request that goes straight to an idle instance of a model whose
recent batches took under this many microseconds is run on the event loop's own thread: for such a model (a trivial Python model) the two thread switches and
the wake-up of the loop cost more than the model; a slower one never blocks the loop longer than
about one request's own decoding does."""

MODEL_CONTROL_MODES = ("none", "explicit", "poll")
"""Triton's model control modes (``docs/user_guide/model_management.md``): ``none`` (the
default: every model loads at start, clients may not load or unload), ``explicit`` (only the
models named at start load; clients load and unload), ``poll`` (every model loads at start and
the repository is re-scanned for changes; clients may not load or unload)."""


def check_model_control(mode: str) -> None:
    """Refuse a client's load or unload unless the server's model control ``mode`` is
    ``explicit``, as Triton refuses it.

    Raises:
        ModelControlDisabledError: ``mode`` is ``none`` or ``poll`` (HTTP 503, gRPC UNAVAILABLE).
    """
    if mode != "explicit":
        from frameserve.errors import ModelControlDisabledError

        raise ModelControlDisabledError(
            f"explicit model load / unload is not allowed in model control mode {mode!r}; "
            "start the server with --model-control-mode explicit to allow it"
        )
