"""The answers of the v2 health endpoints (KServe v2 / Open Inference Protocol, "Health"):
``GET /v2/health/live`` and ``GET /v2/health/ready``, 200 with ``{"live": true}`` /
``{"ready": true}``, else 503 with the same key false and an ``error``. One home for the
single-process application's routes and a front end's own answers (``serve --http-workers N``
answers a probe in the process that took it, from the readiness the owner last published, so
a kubelet's probes never wait on the model-owning process)."""

from __future__ import annotations

import orjson

__all__ = ["LIVE_PATH", "READY_PATH", "health_answer"]

LIVE_PATH = "/v2/health/live"
READY_PATH = "/v2/health/ready"

_LIVE = orjson.dumps({"live": True})
_NOT_LIVE = orjson.dumps({"error": "the server is not live", "live": False})
_READY = orjson.dumps({"ready": True})
_NOT_READY = orjson.dumps(
    {"error": "the server is not ready (models are loading or it is shutting down)", "ready": False}
)


def health_answer(path: str, *, live: bool, ready: bool) -> tuple[int, bytes] | None:
    """``(HTTP status, JSON body)`` of a ``GET`` of ``path`` when it is a health endpoint, for a
    server that is ``live`` and ``ready`` as given; ``None`` for any other path."""
    if path == LIVE_PATH:
        return (200, _LIVE) if live else (503, _NOT_LIVE)
    if path == READY_PATH:
        return (200, _READY) if ready else (503, _NOT_READY)
    return None
