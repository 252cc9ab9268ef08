"""The response sender of Triton's Python backend (``request.get_response_sender()``), re-exported
by :mod:`frameserve.backends.python.pb_utils`.

A decoupled model (``model_transaction_policy { decoupled: true }``) answers each request with
zero or more responses through its sender, from ``execute`` or from any thread afterwards, and
ends the request with ``send(flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)`` (with or without a last
response); ``execute`` returns ``None``. A model that is not decoupled may use the sender too: one
response, with the final flag, and ``execute`` returns ``None`` (python_backend ``README.md``,
"Decoupled mode" and "Using the response sender in non-decoupled models").

The rules and their messages follow Triton's ``src/pb_stub/response_sender.cc`` (2.51): a flag
other than 0 or FINAL, a send without response and without FINAL, and any send after FINAL raise
:class:`~frameserve.backends.python._pb_tensor.TritonModelException`; a model that is not
decoupled cannot send a second response, nor FINAL before a response.

Where the responses go is the python backend's business (:data:`Emit`): the request's response
stream in the server, or the one response of a request of a model that is not decoupled. When a
request and its sender are both dropped without FINAL (the model forgot it, or never took the
sender), the request is ended then (FINAL with no response), so no client waits for ever.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from frameserve.backends.python._pb_tensor import TritonError, TritonModelException

if TYPE_CHECKING:
    from frameserve.backends.python.pb_utils import InferenceResponse

__all__ = ["TRITONSERVER_RESPONSE_COMPLETE_FINAL", "BlsResponses", "Emit", "InferenceResponseSender", "ResponseStream"]

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
"""The flag that ends a request's responses (``tritonserver.h``)."""

Emit = Callable[[dict[str, np.ndarray[Any, Any]] | None, TritonError | None, bool], None]
"""``emit(outputs, error, final)``: one response of a request (its output arrays by name, only
those the request asked for; or its error; both ``None``: FINAL without a response). Called from
the model's thread; must be thread-safe."""


def _end(emit: Emit, state: list[bool]) -> None:
    """A request's stream collected without FINAL: end it (``state[0]``: closed already)."""
    if not state[0]:
        state[0] = True
        emit(None, None, True)


class ResponseStream:
    """The responses of one request, as the model sends them: what its request and its sender
    share (the first :meth:`sender` call makes the sender; later calls give the same one).

    Args:
        emit: where the responses go (see :data:`Emit`).
        decoupled: the model's ``model_transaction_policy.decoupled``.
        requested: the names the request asked for (other outputs of a response are dropped,
            as Triton prunes them); ``None``: every output.
    """

    def __init__(self, emit: Emit, *, decoupled: bool, requested: Sequence[str] | None) -> None:
        self._emit = emit
        self.decoupled = decoupled
        self._requested = None if requested is None else frozenset(requested)
        self._lock = threading.Lock()
        self._state = [False]  # closed; shared with the finalizer, which must not hold self
        self.sent = 0
        self._sender: InferenceResponseSender | None = None
        weakref.finalize(self, _end, emit, self._state).atexit = False  # not while the interpreter exits

    @property
    def closed(self) -> bool:
        """Whether FINAL was sent."""
        return self._state[0]

    def sender(self) -> InferenceResponseSender:
        """The request's sender (one per request)."""
        with self._lock:
            if self._sender is None:
                self._sender = InferenceResponseSender(self)
            return self._sender

    def send(self, response: InferenceResponse | None, flags: int) -> None:
        """:meth:`InferenceResponseSender.send` (see there)."""
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        with self._lock:
            if not self.decoupled:
                if response is not None and self.sent > 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send more than one response."
                    )
                if response is None and final and self.sent == 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send complete final before "
                        "sending a response."
                    )
            if self._state[0]:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            if final:
                self._state[0] = True
            self.sent += 1
            # emitted under the lock: one request's responses keep the order they were sent in
            if response is None:
                self._emit(None, None, final)
                return
            error = response.error()
            if error is not None:
                self._emit(None, error, final)
                return
            wanted = self._requested
            outputs = {
                t.name(): t.as_numpy() for t in response.output_tensors() if wanted is None or t.name() in wanted
            }
            self._emit(outputs, None, final)

    def fail(self, error: TritonError) -> None:
        """End the request with ``error`` unless FINAL was sent already (``execute`` failed)."""
        with self._lock:
            if self._state[0]:
                return
            self._state[0] = True
            self._emit(None, error, True)


class InferenceResponseSender:
    """Triton's ``InferenceResponseSender``: ``request.get_response_sender()``.

    Thread-safe: a model may send from any thread, during ``execute`` or after it returned.
    """

    __slots__ = ("_stream", "__weakref__")

    def __init__(self, stream: ResponseStream) -> None:
        self._stream = stream

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        """Send one response of the request, ``flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL`` with
        the last one (or alone, with no response, after the last one).

        Raises:
            TritonModelException: a flag other than 0 or FINAL; no response and no FINAL; a send
                after FINAL ("Response sender has been closed"); for a model that is not
                decoupled, a second response or FINAL before any response. Triton's texts.
        """
        self._stream.send(response, int(flags))

    def close(self) -> None:
        """End the request (FINAL with no response) if it was not ended yet (the early Python
        backend examples call it)."""
        stream = self._stream
        if not stream.closed:
            try:
                stream.send(None, TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except TritonModelException:  # closed meanwhile, or not decoupled and nothing sent
                pass

    def is_cancelled(self) -> bool:
        """Always ``False`` (frameserve does not pass cancellation to Python models)."""
        return False

    def __repr__(self) -> str:
        return f"InferenceResponseSender(sent={self._stream.sent}, closed={self._stream.closed})"


class BlsResponses:
    """What ``InferenceRequest.exec(decoupled=True)`` returns: the called model's responses, as
    they come, in order (a decoupled model's response sink while it answers; the one answer of
    any other model). Iterating blocks until the next response; a FINAL without a response is
    Triton's empty last response (no output tensors). :meth:`cancel` drops what is still to
    come. Bounded: a model that answers faster than the caller reads waits in ``send``, except
    on the caller's own thread (the called model may run there).

    Args:
        convert: ``(outputs, error) -> InferenceResponse``.
        capacity: responses held unread at most.
    """

    def __init__(
        self,
        convert: Callable[[dict[str, np.ndarray[Any, Any]] | None, BaseException | None], Any],
        capacity: int = 1024,
    ) -> None:
        self._convert = convert
        self._capacity = capacity
        self._cond = threading.Condition()
        self._items: list[tuple[Any, BaseException | None, bool]] = []
        self._ended = False
        self._done = False
        self._cancelled = False
        self._reader = threading.get_ident()

    def send(self, outputs: Any, error: BaseException | None, final: bool) -> None:
        """:class:`frameserve.request.ResponseSink`'s ``send`` (later calls after the end are dropped)."""
        with self._cond:
            if self._ended or self._cancelled:
                return
            if threading.get_ident() != self._reader:
                while len(self._items) >= self._capacity and not self._cancelled:
                    self._cond.wait()
            self._ended = final
            self._items.append((outputs, error, final))
            self._cond.notify_all()

    def __iter__(self) -> BlsResponses:
        return self

    def __next__(self) -> Any:
        with self._cond:
            if self._done or self._cancelled:
                raise StopIteration
            self._cond.wait_for(lambda: bool(self._items) or self._cancelled)
            if self._cancelled:
                raise StopIteration
            outputs, error, final = self._items.pop(0)
            self._done = final
            self._cond.notify_all()
        return self._convert(outputs, error)

    def cancel(self) -> None:
        """Stop: no more responses are read or kept."""
        with self._cond:
            self._cancelled = True
            self._items.clear()
            self._cond.notify_all()
