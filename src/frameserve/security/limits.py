"""Caps on what one inference request may make the server allocate or parse, checked on the
declared sizes before anything is allocated.

Why each cap exists (the costs quoted here are bench/README.md's "Figures behind design
choices", with the command that measures each; they vary by machine, the reasons do not):

- ``max_tensor_elements``: a declared shape is only a few bytes on the wire, but numpy fails
  (``[0, 2**40, 2**40, 2**40]``: "array is too big") or allocates what it names; every dimension
  and the product of the dimensions are capped (zeros do not exempt the others).
- ``max_bytes_elements``: each BYTES element becomes a Python ``bytes`` object; splitting is
  pure-Python work per element, and the backends convert them again. The
  decode runs off the event loop, but the cap bounds the CPU one request can take.
- ``max_bytes_data_bytes``: the bytes of BYTES elements are copied several times on their way
  (split into objects, converted by the backend and back); onnxruntime converts string tensors
  while holding the GIL, so a large one stalls every thread of the server.
- ``max_json_bytes``: orjson parses in one call that holds the GIL (nothing else in the
  process runs meanwhile, wherever it runs), for a time that grows with the bytes, and a JSON
  number takes ~10 bytes where binary takes 4: large tensors belong in the binary tensor data
  extension. The default, 2 MiB (~200,000 numbers), bounds how long one request can stall the
  process's event loop and every other tenant with it; a binary request's tensors are not JSON
  and stay under ``--max-body-bytes`` (bench/README.md "Figures behind design choices").
- ``max_inputs``, ``max_outputs``, ``max_parameters``: every tensor and parameter of a request is
  checked and converted on its own (Python work per input), so the cost follows their count,
  not the bytes: a 7 MB ``ModelInfer`` of 300,000 one-element inputs takes seconds of server
  CPU before it is refused. The counts are checked before any tensor is looked at (gRPC: while
  the message's top-level fields are split, and on the parsed message; HTTP: on the parsed JSON).
  Triton sets no such caps; the defaults leave room for the models that take hundreds of feature
  inputs (recommenders) and for every tensor in shared memory (three parameters each), and bound
  a request's per-tensor work to milliseconds.

A request over a cap is refused with :class:`~frameserve.errors.LimitExceededError` (a
:class:`~frameserve.errors.TensorError`: 400, answered late, :mod:`frameserve.security.tarpit`) or, for the JSON
size, :class:`~frameserve.errors.PayloadTooLargeError` (413), naming the cap and its ``serve`` flag.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from frameserve.errors import LimitExceededError, PayloadTooLargeError, shown

__all__ = ["DEFAULT_DEADLINES", "DEFAULT_LIMITS", "HttpDeadlines", "TensorLimits"]


@dataclass(frozen=True)
class TensorLimits:
    """Per-request caps of the v2 inference routes (HTTP and gRPC alike).

    Attributes:
        max_tensor_elements: the most elements one input tensor may declare, and the largest
            single dimension (``serve --max-tensor-elements``; default 2**27 = 134,217,728,
            512 MiB of FP32).
        max_bytes_elements: the most BYTES elements one request may carry over all its inputs
            (``serve --max-bytes-elements``; default 2**14 = 16,384: onnxruntime converts a
            string tensor in one call that holds the GIL, about 100 ns per element here, and
            decoding takes as long again; 262,144 elements stalled every thread of the server
            for 60 ms or more per request).
        max_bytes_data_bytes: the most bytes of BYTES data (length prefixes included) one
            request may carry over all its inputs (``serve --max-bytes-data-bytes``; default
            16 MiB).
        max_json_bytes: the largest JSON document of a request (the whole body without binary
            data, or the JSON header before it), in bytes (``serve --max-json-bytes``; default
            2 MiB).
        max_inputs: the most input tensors in one request (``serve --max-inputs``; default
            1,024). On gRPC it also caps the ``raw_input_contents`` entries.
        max_outputs: the most requested outputs in one request (``serve --max-outputs``;
            default 1,024).
        max_parameters: the most parameters in one request: the request's own, every input's
            and every output's together (``serve --max-parameters``; default 8,192: three
            shared-memory parameters on each of the most inputs and outputs, and more).
    """

    max_tensor_elements: int = 1 << 27
    max_bytes_elements: int = 1 << 14
    max_bytes_data_bytes: int = 16 << 20
    max_json_bytes: int = 2 << 20
    max_inputs: int = 1024
    max_outputs: int = 1024
    max_parameters: int = 8192

    def __post_init__(self) -> None:
        for name in (
            "max_tensor_elements",
            "max_bytes_elements",
            "max_bytes_data_bytes",
            "max_json_bytes",
            "max_inputs",
            "max_outputs",
            "max_parameters",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    def check_shape(self, where: str, shape: Sequence[int], *, name: str | None = None) -> int:
        """The element count of ``shape`` (non-negative ints), after checking it against the cap.
        ``where`` (and ``name``, a request's tensor name, shown bounded) say in the message what
        the shape is of; they are formatted only on refusal.

        Raises:
            LimitExceededError: a dimension or the product of the non-zero dimensions is over
                ``max_tensor_elements``.
        """
        cap = self.max_tensor_elements
        nonzero, empty = 1, False
        for d in shape:  # a dimension over the cap makes the product of the non-zero ones so too
            if d:
                nonzero *= d
            else:
                empty = True
        if nonzero > cap:
            if name is not None:
                where = f"{where} {shown(name)}"
            raise LimitExceededError(
                f"{where}: shape {list(shape)[:8]}{'...' if len(shape) > 8 else ''} declares more than "
                f"{cap} elements, the server's cap (serve --max-tensor-elements)"
            )
        return 0 if empty else nonzero

    def check_bytes_elements(self, where: str, count: int) -> None:
        """Refuse a request whose BYTES inputs add up to more than ``max_bytes_elements`` elements.

        Raises:
            LimitExceededError: ``count`` is over the cap.
        """
        _check_cap(where, count, "BYTES elements", self.max_bytes_elements, "--max-bytes-elements")

    def check_bytes_data(self, where: str, size_bytes: int) -> None:
        """Refuse a request whose BYTES inputs carry more than ``max_bytes_data_bytes`` bytes.

        Raises:
            LimitExceededError: ``size_bytes`` is over the cap.
        """
        _check_cap(where, size_bytes, "bytes of BYTES data", self.max_bytes_data_bytes, "--max-bytes-data-bytes")

    def check_counts(self, *, inputs: int = 0, outputs: int = 0, parameters: int = 0) -> None:
        """Refuse a request with more inputs, requested outputs or parameters (its own, its
        inputs' and its outputs' together) than the caps; a count may be partial, as long as it
        is already over its cap (a counter stops at the first one over).

        Raises:
            LimitExceededError: a count is over its cap (the message names the cap and its flag, never
                the request's names).
        """
        if inputs <= self.max_inputs and outputs <= self.max_outputs and parameters <= self.max_parameters:
            return  # every request that is served: no tuples built
        for count, cap, what, flag in (
            (inputs, self.max_inputs, "inputs", "--max-inputs"),
            (outputs, self.max_outputs, "requested outputs", "--max-outputs"),
            (parameters, self.max_parameters, "parameters (its own, its inputs' and its outputs')", "--max-parameters"),
        ):
            if count > cap:
                raise LimitExceededError(f"this request has more than {cap} {what}, the server's cap (serve {flag})")

    def check_json(self, size_bytes: int) -> None:
        """Refuse a JSON document longer than ``max_json_bytes`` before it is parsed.

        Raises:
            PayloadTooLargeError: ``size_bytes`` is over the cap (the message says to send the
                tensors as binary data instead).
        """
        if size_bytes > self.max_json_bytes:
            raise PayloadTooLargeError(
                f"the request's JSON is {size_bytes} bytes, over the server's cap of {self.max_json_bytes} "
                "(serve --max-json-bytes); send large tensors as binary data (Triton's binary tensor "
                "data extension: tritonclient's binary_data=True, the Inference-Header-Content-Length header)"
            )


DEFAULT_LIMITS = TensorLimits()
"""The caps ``serve`` applies unless told otherwise."""


def _check_cap(where: str, got: int, what: str, cap: int, flag: str) -> None:
    """Raise ``LimitExceededError`` ("``<where>: <got> <what> in this request, over the server's cap of
    <cap> (serve <flag>)``") when ``got`` is over ``cap``."""
    if got > cap:
        raise LimitExceededError(
            f"{where}: {got} {what} in this request, over the server's cap of {cap} (serve {flag})"
        )


@dataclass(frozen=True)
class HttpDeadlines:
    """How long a client may take to send a request (:mod:`frameserve.protocol.http._wire` enforces them).

    Attributes:
        header_timeout_s: longest time from a connection's opening (or a kept-alive request's
            first byte) to the end of the request's head, seconds (``serve
            --header-timeout-s``; default 10, ``mod_reqtimeout``'s is 20, nginx's 60).
        max_header_bytes: longest request head (request line and headers), bytes (default
            64 KiB; Node's and Apache's are 16 KiB and 8 KiB per line; over it: 431).
        body_timeout_s: longest wait for the body's first byte after the head, and the base of
            the body's deadline, seconds (``serve --body-timeout-s``; default 20, as
            ``mod_reqtimeout``'s).
        body_min_rate: bytes per second that extend the body's deadline by one second each
            (``serve --body-min-rate``; default 4096, a 32 kbit/s uplink).
        keep_alive_timeout_s: longest idle time of a kept-alive connection, seconds (``serve
            --keep-alive-timeout-s``; default 30).
    """

    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 * 1024
    body_timeout_s: float = 20.0
    body_min_rate: int = 4096
    keep_alive_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)!r}")
        if self.max_header_bytes < 1024 or self.body_min_rate < 1:
            raise ValueError(
                f"max_header_bytes must be >= 1024 and body_min_rate >= 1, got "
                f"{self.max_header_bytes!r}, {self.body_min_rate!r}"
            )


DEFAULT_DEADLINES = HttpDeadlines()
