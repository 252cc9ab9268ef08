"""Parsing a JSON document that must be an object, with one wording for its errors.

A base-layer module (``errors`` is its only frameserve import): the HTTP app's small bodies, the
job API's ``POST /v1/analyze`` body and its ``params`` field, and the console's results files all
parse through :func:`json_object`, so "not JSON" and "not an object" read the same everywhere.
"""

from __future__ import annotations

from typing import Any

import orjson

from frameserve.errors import InvalidInputError


def json_object(data: bytes | str, what: str = "the request body", shape: str = "") -> dict[str, Any]:
    """``data`` (UTF-8 JSON text) parsed as a JSON object.

    Args:
        data: the JSON text (RFC 8259), bytes or str.
        what: names the document in an error, e.g. ``"the request body"``.
        shape: appended to the "not an object" error to say what the object holds, e.g.
            ``' {"source": URI}'``.

    Returns:
        The object as a ``dict`` (keys ``str``; values as :func:`orjson.loads` gives them).

    Raises:
        InvalidInputError: ``malformed JSON in <what>: <parser's reason>`` when ``data`` is not
            JSON; ``<what> must be a JSON object<shape>, got <type>`` when it is JSON but not an
            object.
    """
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidInputError(f"malformed JSON in {what}: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidInputError(f"{what} must be a JSON object{shape}, got {type(doc).__name__}")
    return doc
