"""The endpoint of ``POST /v1/jobs``, made for one router's request model (a part of
:mod:`frameserve.jobs.api`).

FastAPI reads a route's body model from its endpoint's annotation. The model of ``POST /v1/jobs``
is built per router (:func:`~frameserve.jobs._models._request_model`: the server's pipelines as
the schema's ``pipeline`` enum, its caps as the bounds of ``max_attempts`` and ``timeout_s``), so
the endpoint is made by :func:`submit_endpoint`, which takes the model as a parameter. This module
does not use ``from __future__ import annotations``: the annotation ``req: model`` is the model
class itself when the function is defined, nothing for FastAPI to resolve by name.
"""

from collections.abc import Callable
from typing import Any

from fastapi import Depends, Header, Response

from frameserve.jobs._models import JobRequest

__all__ = ["SubmitHandler", "submit_endpoint"]

SubmitHandler = Callable[[JobRequest, Response, str | None, Any], Any]
"""``handle(req, response, idempotency_key, access)``: what a submit does once FastAPI parsed and
validated the body (``req``, an instance of the router's model) and resolved the caller
(``access``, what the ``access`` dependency returns); returns the response body."""


def submit_endpoint(model: type[JobRequest], handle: SubmitHandler, access: Callable[..., Any]) -> Callable[..., Any]:
    """The ``POST /v1/jobs`` endpoint: body ``model`` (a subclass of :class:`JobRequest`), header
    ``Idempotency-Key`` (255 characters at most), the caller from the dependency ``access``;
    calls ``handle``."""

    def submit(
        req: model,  # type: ignore[valid-type]  # the router's model: see the module docstring
        response: Response,
        idempotency_key: str | None = Header(None, alias="Idempotency-Key", max_length=255),
        caller: Any = Depends(access),
    ) -> Any:
        return handle(req, response, idempotency_key, caller)

    return submit
