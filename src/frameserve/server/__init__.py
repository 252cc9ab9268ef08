"""Assembles the online server: v2 HTTP + v2 gRPC + Prometheus metrics over one
:class:`~frameserve.service.InferenceService` (``frameserve serve``)."""

from __future__ import annotations

from frameserve.server._server import Server, ServerOptions

__all__ = ["Server", "ServerOptions"]
