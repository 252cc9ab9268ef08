"""The Open Inference Protocol ("KServe v2") over HTTP/REST, with Triton's extensions.

:func:`create_app` builds the FastAPI application over an
:class:`~frameserve.service.InferenceService`; :func:`create_metrics_app` the Prometheus
``/metrics`` application for the metrics port; :mod:`frameserve.protocol.http.codec` is the pure
JSON/binary tensor codec both use.
"""

from __future__ import annotations

from frameserve.protocol.http._app import DEFAULT_MAX_BODY_BYTES, HTTP_EXTENSIONS, create_app, create_metrics_app

__all__ = ["DEFAULT_MAX_BODY_BYTES", "HTTP_EXTENSIONS", "create_app", "create_metrics_app"]
