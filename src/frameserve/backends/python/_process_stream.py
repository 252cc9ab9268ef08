"""Decoupled models under process isolation (:mod:`~frameserve.backends.python.process`): the
responses a model's sender sends in its worker process, from ``execute`` or from any thread
after it, reach the requests' sinks in the server.

Worker side: :func:`worker_emit` sends each response as one pipe message ``("response", token,
block name, descriptors, error, final)`` (tensors in a shared-memory block of their own, see
:mod:`~frameserve.backends.python._shm_tensors`), under the channel's send lock (the model's
threads and the worker's main loop send on one pipe).

Server side: once a decoupled model is loaded, a :class:`ResponsePump` thread reads the pipe: a
response goes to its request's emit (:class:`StreamTable`; the block is copied out and
unlinked), every other message to an inbox the session's calls read. One thread reads, so a
request's responses keep the order they were sent in. A worker that dies ends every open
request with an error.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing.connection
import queue
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from frameserve.backends.python import pb_utils
from frameserve.backends.python._shm_tensors import open_block, pack_tensors, unpack_tensors

__all__ = ["DIED", "ResponsePump", "StreamTable", "worker_emit"]

log = logging.getLogger(__name__)

DIED = ("died",)
"""What the inbox holds once the worker is gone (the pump's last message)."""


def worker_emit(chan: Any, token: int) -> pb_utils.Emit:
    """In the worker: the emit of the request the server knows as ``token`` (its responses cross
    the pipe; see the module docstring)."""

    def emit(outputs: dict[str, np.ndarray[Any, Any]] | None, error: pb_utils.TritonError | None, final: bool) -> None:
        bad = [n for n, a in (outputs or {}).items() if not isinstance(a, np.ndarray)]
        if bad:
            outputs, error = None, pb_utils.TritonError(f"outputs {bad} are not numpy arrays")
        block, descs = pack_tensors(outputs) if outputs else (None, [])
        name = None
        if block is not None:
            name = block.name
            block.close()  # the server unlinks it once it has read it
        err = None if error is None else (error.code(), error.message())
        chan.send(("response", token, name, descs if outputs is not None else None, err, final))

    return emit


class StreamTable:
    """In the server: the open requests of a decoupled model in a worker, by token."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._emits: dict[int, pb_utils.Emit] = {}
        self._tokens = itertools.count()

    def open(self, emit: pb_utils.Emit) -> int:
        """Register a request's emit; its token for the worker."""
        with self._lock:
            token = next(self._tokens)
            self._emits[token] = emit
            return token

    def deliver(self, msg: tuple[Any, ...]) -> int:
        """One ``("response", ...)`` message to its request (the block copied out, unlinked);
        the tensor bytes read."""
        _, token, name, descs, err, final = msg
        block = open_block(name) if name else None
        try:
            outputs = unpack_tensors(block, descs, copy=True) if descs is not None else None
        finally:
            if block is not None:
                block.close()
                block.unlink()
        with self._lock:
            emit = self._emits.pop(token, None) if final else self._emits.get(token)
        if emit is not None:
            error = None if err is None else pb_utils.TritonError(err[1], err[0])
            emit(outputs if error is None else None, error, final)
        return sum(int(d[5]) for d in descs or ())

    def drop(self, tokens: list[int]) -> None:
        """Forget requests that never reached the worker."""
        with self._lock:
            for token in tokens:
                self._emits.pop(token, None)

    def fail_all(self, text: str) -> None:
        """End every open request with ``text`` (the worker is gone)."""
        with self._lock:
            emits, self._emits = list(self._emits.values()), {}
        for emit in emits:
            emit(None, pb_utils.TritonError(text), True)


class ResponsePump:
    """The thread that reads a worker's pipe for a decoupled model (see the module docstring).

    Args:
        chan: the server's end (``recv``).
        sentinel: the worker process's sentinel (ready when it exited).
        streams: where responses go.
        name: the thread's name.
        on_bytes: told the tensor bytes of each response read.
    """

    def __init__(
        self, chan: Any, sentinel: Any, streams: StreamTable, name: str, on_bytes: Callable[[int], None]
    ) -> None:
        self._chan = chan
        self._sentinel = sentinel
        self._streams = streams
        self._on_bytes = on_bytes
        self.inbox: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                ready = multiprocessing.connection.wait([self._chan.conn, self._sentinel])
                if self._chan.conn not in ready:
                    return  # exited, and nothing left to read
                try:
                    msg = self._chan.recv()
                except (EOFError, OSError):
                    return
                if msg[0] == "response":
                    try:
                        self._on_bytes(self._streams.deliver(msg))
                    except Exception:  # one bad response must not stop the others
                        log.exception("a streamed response could not be delivered")
                    continue
                self.inbox.put(msg)
        finally:
            self._streams.fail_all("the Python model's worker process exited; its open requests end here")
            self.inbox.put(DIED)

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for the thread to end (it ends when the worker exits or the pipe closes)."""
        self._thread.join(timeout_s)
