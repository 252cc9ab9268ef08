"""The one inference request every transport decodes into and the service runs:
:class:`InferRequest`, with the outputs it asks for (:class:`RequestedOutput`).

The HTTP codec, the gRPC codec, the Python backend's ``pb_utils.InferenceRequest`` (BLS calls
and the requests ``execute`` receives) and in-process callers all build this one type; the
service checks it against the model and the scheduler queues it. Field meanings follow the
Open Inference Protocol (``inference_rest.md`` / ``inference_grpc.md``) and Triton's
extensions (``docs/protocol/extension_parameters.md``, ``extension_schedule_policy.md``,
``extension_binary_data.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from frameserve.errors import InvalidInputError, TensorError
from frameserve.types import DataType

__all__ = [
    "MAX_SEQUENCE_ID_CHARS",
    "SEVERAL_TENANTS",
    "TRACEPARENT_CHARS",
    "InferRequest",
    "RequestTraceSink",
    "RequestedOutput",
    "ResponseSink",
    "StatsSink",
    "pop_sequence_parameters",
]

SEVERAL_TENANTS = "(several tenants)"
"""The tenant of a request made for several tenants at once: a Python model's BLS call without a
``correlation_id`` while its batch holds requests of several tenants
(:mod:`frameserve.backends.python._bls`), and the calls made from such a call. No token can be
named so (a token's name is letters, digits and ``._@-``). Such a request is never cached
(:class:`~frameserve.scheduler.ResponseCache`): its result may come from any of those tenants'
data; and it cannot be part of a sequence (the sequence batcher refuses it): whose state the
sequence would carry cannot be told."""

TRACEPARENT_CHARS = 55
"""Length of a W3C ``traceparent`` of version 00 (``00-<32 hex>-<16 hex>-<2 hex>``); the
transports pass on only values of this length (the exporter checks the form)."""

MAX_SEQUENCE_ID_CHARS = 1024
"""The longest string ``sequence_id`` a request may carry (a UUID takes 36)."""


_NO_SEQUENCE: tuple[int | str, bool, bool] = (0, False, False)


def pop_sequence_parameters(params: dict[str, Any]) -> tuple[int | str, bool, bool]:
    """Take Triton's sequence parameters out of a request's decoded ``parameters`` (HTTP JSON
    or gRPC ``InferParameter`` values): ``sequence_id`` (an unsigned 64-bit integer or a string,
    0 / "" / absent = none), ``sequence_start`` and ``sequence_end`` (booleans, absent = false).
    The one reading of them for every transport.

    Returns:
        ``(sequence_id, sequence_start, sequence_end)``; ``params`` no longer holds them.

    Raises:
        InvalidInputError: a ``sequence_id`` that is neither (a negative, too large or boolean
            number, a string over :data:`MAX_SEQUENCE_ID_CHARS`), a flag that is not a boolean.
    """
    if not params:  # most requests: nothing to take
        return _NO_SEQUENCE
    sid = params.pop("sequence_id", 0)
    start = params.pop("sequence_start", False)
    end = params.pop("sequence_end", False)
    if isinstance(sid, bool) or not isinstance(sid, int | str):
        raise InvalidInputError(
            f"request parameter 'sequence_id' must be an unsigned integer or a string, got {sid!r}"[:300]
        )
    if isinstance(sid, int) and not 0 <= sid < 1 << 64:
        raise InvalidInputError(f"request parameter 'sequence_id' {sid} is not an unsigned 64-bit integer"[:300])
    if isinstance(sid, str) and len(sid) > MAX_SEQUENCE_ID_CHARS:
        raise InvalidInputError(
            f"request parameter 'sequence_id' is {len(sid)} characters long; at most {MAX_SEQUENCE_ID_CHARS}"
        )
    for key, flag in (("sequence_start", start), ("sequence_end", end)):
        if not isinstance(flag, bool):
            raise InvalidInputError(f"request parameter {key!r} must be a boolean, got {type(flag).__name__}")
    return sid, start, end


class StatsSink(Protocol):
    """Where a model's scheduler also reports how it ran one request (Triton's secondary stats
    aggregator): an ensemble passes one with each step's request and adds the steps' times to
    its own statistics."""

    def add_step_times(
        self, *, queue_ns: int, compute_input_ns: int, compute_infer_ns: int, compute_output_ns: int
    ) -> None:
        """One request answered with outputs: its time in the queue and its batch's compute
        times (ns), called before the request's future completes."""
        ...


class ResponseSink(Protocol):
    """Where the responses of a decoupled model (``model_transaction_policy.decoupled``) to one
    request go, as the model sends them: the transport that streams them (gRPC
    ``ModelStreamInfer``, HTTP ``generate_stream``) gives one with the request.

    Implementations are thread-safe (a model sends from any thread, the service from the one
    that fails the request) and ignore everything after a ``final`` call.
    """

    def send(
        self, outputs: Mapping[str, np.ndarray[Any, Any]] | None, error: BaseException | None, final: bool
    ) -> None:
        """One response: its outputs (those the request asked for), or its error (a
        ``FrameserveError`` for the request alone); both ``None``: the end with no response.
        ``final``: the request's last call."""
        ...


class RequestTraceSink(Protocol):
    """A sampled request's trace (Triton's trace extension,
    :class:`frameserve.scheduler.RequestTrace`): the scheduler adds the times it took."""

    def computed(
        self, queue_start_ns: int, start_ns: int, input_end_ns: int, output_start_ns: int, end_ns: int
    ) -> None:
        """Queued at ``queue_start_ns``; its batch ran from ``start_ns`` to ``end_ns`` (ns)."""
        ...


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    """One output a request asks for.

    Attributes:
        name: the output's name.
        binary_data: HTTP's ``parameters.binary_data``: send it as binary (``True``) or JSON
            (``False``); ``None`` follows the request's :attr:`InferRequest.binary_data_output`.
            gRPC always answers raw bytes and ignores it.
        parameters: the output's other parameters as given, e.g. ``classification`` (Triton's
            classification extension: the top N classes per batch item as BYTES, see
            :mod:`frameserve.scheduler._classify`).
    """

    name: str
    binary_data: bool | None = None
    parameters: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, eq=False)
class InferRequest:
    """One inference request, transport-neutral (numpy tensors; no protobuf, no JSON).

    Treat it as immutable: the fields are frozen; ``inputs`` and ``parameters`` are mappings the
    request owns once built (callers do not change them afterwards).

    Attributes:
        model_name: the model to run.
        inputs: input name -> numpy array, shaped and typed as sent (BYTES: ``object`` arrays
            of ``bytes``); with ``max_batch_size > 0`` each has the batch dim first. Arrays
            decoded from a body may be read-only views of it.
        model_version: the version; ``None`` = the highest loaded.
        outputs: the outputs wanted, in this order; empty = every configured output.
        parameters: the request's free parameters (the v2 ``parameters`` object without the
            keys the codecs interpret: ``priority``, ``timeout``, ``binary_data_output``);
            passed to Python models.
        priority: Triton's meaning: 1 is the highest level, 0 = the model's default level.
        timeout_us: queue timeout in microseconds (0 = none); honoured where the model's queue
            policy has ``allow_timeout_override`` (it may only shorten the default).
        id: the caller's request id (v2 ``id``), echoed in the response; ``""`` when none.
        binary_data_output: HTTP's ``parameters.binary_data_output``: the default of
            :attr:`RequestedOutput.binary_data` (and of every output when none is named).
        stats_sink: also told the request's queue and compute times when it succeeds (an
            ensemble's step requests carry one); ``None`` for every other request.
        trace: the request's trace when the server's tracer sampled it (set by the service);
            ``None`` otherwise.
        traceparent: the W3C ``traceparent`` header it came with (``""`` when none); traced
            whatever the sampling in ``opentelemetry`` trace mode, as in Triton.
        sequence_id: the sequence (Triton's correlation id) the request belongs to: an
            unsigned 64-bit integer or a string; ``0`` / ``""`` = none. Read by the sequence
            batcher of a model with ``sequence_batching``, ignored by other models.
        sequence_start: the first request of its sequence (``sequence_start``).
        sequence_end: the last request of its sequence (``sequence_end``).
        tenant: the tenant the request comes from (its token's name; ``""`` = the one tenant of
            a server without tokens, or an in-process caller), set by the transport. What a
            request creates in the server is keyed by it: a sequence is ``(tenant,
            sequence_id)``, so one tenant can neither continue nor restart another's.
        responses: where a decoupled model's responses go (a streaming transport's); the
            service refuses a request for a decoupled model without one, and other models
            ignore it (their answer is the request's future).

    Raises:
        TensorError: a negative ``priority`` or ``timeout_us``, ``inputs`` that is not a
            mapping, or a numeric ``sequence_id`` outside [0, 2**64).
    """

    model_name: str
    inputs: Mapping[str, np.ndarray[Any, Any]]
    model_version: int | None = None
    outputs: tuple[RequestedOutput, ...] = ()
    parameters: Mapping[str, Any] = field(default_factory=dict)
    priority: int = 0
    timeout_us: int = 0
    id: str = ""
    binary_data_output: bool = False
    stats_sink: StatsSink | None = None
    trace: RequestTraceSink | None = None
    traceparent: str = ""
    sequence_id: int | str = 0
    sequence_start: bool = False
    sequence_end: bool = False
    responses: ResponseSink | None = None
    tenant: str = ""

    def __post_init__(self) -> None:
        if self.priority < 0:
            raise TensorError(f"priority {self.priority} given; 1 is the highest level, 0 the model's default")
        if self.timeout_us < 0:
            raise TensorError(f"timeout {self.timeout_us} given; a timeout is >= 0 microseconds (0 = none)")
        if type(self.inputs) is not dict and not isinstance(self.inputs, Mapping):  # dict: no ABC check
            raise TensorError(f"a request's inputs map names to arrays; got {type(self.inputs).__name__}")
        if isinstance(self.sequence_id, int) and not 0 <= self.sequence_id < 1 << 64:
            raise TensorError(
                f"sequence_id {self.sequence_id} given; a numeric sequence id is an unsigned 64-bit integer"
            )

    @property
    def output_names(self) -> tuple[str, ...] | None:
        """The names of :attr:`outputs` in order, or ``None`` when every output is wanted."""
        if not self.outputs:
            return None
        return tuple(o.name for o in self.outputs)

    def __repr__(self) -> str:
        shapes = {}
        for name, array in self.inputs.items():
            try:
                shapes[name] = f"{DataType.from_numpy(array.dtype).value}{list(array.shape)}"
            except (AttributeError, TensorError):
                shapes[name] = type(array).__name__
        version = "" if self.model_version is None else f", version={self.model_version}"
        return (
            f"InferRequest({self.model_name!r}{version}, id={self.id!r}, inputs={shapes}, "
            f"outputs={[o.name for o in self.outputs]}, priority={self.priority}, timeout_us={self.timeout_us})"
        )
