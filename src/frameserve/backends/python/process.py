"""Process isolation for the ``python`` backend (``parameters.isolation: process``).

One worker process per session (model instance), started with ``multiprocessing``'s ``spawn``
method, holds the ``TritonPythonModel``. The server process and the worker talk over a pipe in
small pickled messages that never hold an array: every tensor travels through a
``multiprocessing.shared_memory`` block, described by ``(name, kind, dtype, shape, offset,
size_bytes)``. BYTES tensors are laid out in Triton's wire form (4-byte little-endian length,
then the bytes). BLS calls made by the model (``pb_utils.InferenceRequest(...).exec()``) come
back to the server over the same pipe, as the parts of a :class:`~frameserve.request.InferRequest`,
and run there through ``BackendContext.infer``.

Shared memory ownership: the server unlinks every block, its own and the worker's, once both
sides are done with it, so a worker that dies leaks nothing past the server's next message.

A decoupled model's responses cross the same pipe whenever its sender sends them (from
``execute`` or a thread of the model after it); once such a model is loaded one thread of the
server reads the pipe (:mod:`~frameserve.backends.python._process_stream`).

A worker that dies (crash, ``os._exit``, killed) fails the requests it was running with
:class:`~frameserve.errors.InferenceError`; the next request starts a fresh worker and runs
``initialize`` again (the session is not marked failed). If the restart itself fails, that
request fails with the reason and the next one tries again.

As with any ``spawn`` start, a program that loads process-isolated models from a script must
guard its entry point (``if __name__ == "__main__":``); ``frameserve`` and ``python -m
frameserve`` do. Workers are daemonic (they end with the server), so a model cannot start
processes of its own from them.
"""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.connection
import os
import pickle
import queue
import signal
import socket
import threading
from collections.abc import Mapping, Sequence
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np

from frameserve.backends.base import BackendContext
from frameserve.backends.python import pb_utils
from frameserve.backends.python._bls import check_claimed
from frameserve.backends.python._process_stream import DIED, ResponsePump, StreamTable, worker_emit
from frameserve.backends.python._shm_tensors import Desc, open_block, pack_tensors, unlink_block, unpack_tensors
from frameserve.backends.python.host import (
    BatchFailure,
    ModelHost,
    as_request,
    complete_python_config,
    finish_results,
    initialize_args,
    run_one,
    stream_emit,
)
from frameserve.errors import FrameserveError, InferenceError, ModelConfigError
from frameserve.repository import ModelConfig
from frameserve.request import InferRequest, RequestedOutput
from frameserve.types import TensorSpec

__all__ = ["PythonProcessSession", "pack_tensors", "unpack_tensors"]

_START_TIMEOUT_S = 120.0
_FINALIZE_TIMEOUT_S = 10.0


def _has_array(obj: Any) -> bool:
    if isinstance(obj, np.ndarray):
        return True
    if isinstance(obj, (list, tuple)):
        return any(_has_array(x) for x in obj)
    if isinstance(obj, dict):
        return any(_has_array(x) for x in obj.values())
    return False


class _Channel:
    """One end of the pipe: pickled messages that must not hold arrays, with counters."""

    def __init__(self, conn: multiprocessing.connection.Connection) -> None:
        self.conn = conn
        self._send_lock = threading.Lock()  # a decoupled model's threads send responses too
        self.messages = 0
        self.pickled_bytes = 0
        self.largest_message_bytes = 0

    def send(self, msg: tuple[Any, ...]) -> None:
        if _has_array(msg):
            raise InferenceError(
                "internal: a numpy array was about to cross the pipe; tensors go through shared memory"
            )
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        with self._send_lock:
            self.messages += 1
            self.pickled_bytes += len(data)
            self.largest_message_bytes = max(self.largest_message_bytes, len(data))
            self.conn.send_bytes(data)

    def recv(self) -> tuple[Any, ...]:
        data = self.conn.recv_bytes()
        self.messages += 1
        self.pickled_bytes += len(data)
        self.largest_message_bytes = max(self.largest_message_bytes, len(data))
        message: tuple[Any, ...] = pickle.loads(data)  # noqa: S301 - our own child process, same code
        return message


# -- the worker process --------------------------------------------------------------------


def worker_main(conn: multiprocessing.connection.Connection, model_file: str, model_name: str, threads: int) -> None:
    """Entry point of a worker process: load ``model_file`` and answer the server's messages
    until ``finalize`` or the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when workers stop
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(threads))  # for frameworks the model imports (torch)
    chan = _Channel(conn)
    bls_lock = threading.Lock()
    leaked: list[shared_memory.SharedMemory] = []
    hooks = threading.main_thread()  # runs this loop, and in it initialize, execute and finalize

    def bls(request: InferRequest) -> dict[str, np.ndarray[Any, Any]]:
        # Only from a hook, or from an async_exec call that execute awaits: then this loop is in
        # the hook and not reading the pipe (a thread of the model's own may outlive execute, and
        # this loop would read the answer as its next message).
        if threading.current_thread() is not hooks and not pb_utils.in_awaited_call():
            raise pb_utils.TritonModelException(
                "a model in a worker process (isolation: process) makes BLS calls from initialize, execute or "
                "finalize (or an async_exec call they await), not from a thread of its own; serve it in process "
                "(isolation: in_process) for that"
            )
        shm, descs = pack_tensors(request.inputs)
        parts = (
            request.model_name,
            request.model_version,
            request.output_names,
            dict(request.parameters),
            request.id,
            (request.sequence_id, request.sequence_start, request.sequence_end),
            request.tenant,  # checked by the server against the batch it sent (_bls.check_claimed)
        )
        try:
            # The server unlinks the result block when it gets our next message, so copy it
            # out before another thread may send one.
            with bls_lock:
                chan.send(("bls", parts, shm.name if shm else None, descs))
                reply = chan.recv()
                if reply[0] == "bls_error":
                    raise _error_from(reply[1], reply[2])
                _, name, out_descs = reply
                block = open_block(name) if name else None
                try:
                    return unpack_tensors(block, out_descs, copy=True)
                finally:
                    if block is not None:
                        block.close()
        finally:
            if shm is not None:
                shm.close()

    try:
        host = ModelHost(Path(model_file), model_name, bls)
    except Exception as exc:
        chan.send(("error", "load", f"{exc}"))
        return
    chan.send(("ready", os.getpid()))
    while True:
        try:
            msg = chan.recv()
        except (EOFError, OSError):
            return
        op = msg[0]
        try:
            if op == "auto_complete":
                chan.send(("ok", host.auto_complete(msg[1])))
            elif op == "initialize":
                host.initialize(msg[1])
                chan.send(("ok", None))
            elif op == "execute":
                chan.send(_execute(host, msg[1], msg[2], msg[3], leaked, msg[4], chan))
            elif op == "finalize":
                host.finalize()
                chan.send(("ok", None))
                return
            else:
                chan.send(("error", "protocol", f"unknown message {op!r}"))
        except FrameserveError as exc:
            chan.send(("error", exc.code, str(exc)))
        except Exception as exc:  # keep serving; the server reports it
            chan.send(("error", "internal", f"{type(exc).__name__}: {exc}"))


def _execute(
    host: ModelHost,
    block_name: str | None,
    requests: Sequence[
        tuple[list[Desc], tuple[str, ...] | None, dict[str, Any], str, tuple[int | str, bool, bool], str]
    ],
    output_names: Sequence[str],
    leaked: list[shared_memory.SharedMemory],
    tokens: Sequence[int] | None = None,
    chan: _Channel | None = None,
) -> tuple[Any, ...]:
    block = open_block(block_name) if block_name else None
    try:
        reqs = [
            InferRequest(
                model_name=host.model_name,
                # a decoupled model may keep its inputs past execute (its threads answer later)
                inputs=unpack_tensors(block, descs, copy=tokens is not None),
                outputs=tuple(RequestedOutput(n) for n in outputs or ()),
                parameters=params,
                id=rid,
                sequence_id=sequence[0],
                sequence_start=sequence[1],
                sequence_end=sequence[2],
                tenant=tenant,
            )
            for descs, outputs, params, rid, sequence, tenant in requests
        ]
        emits = None if tokens is None else [worker_emit(chan, t) for t in tokens]
        try:
            raw = host.execute(reqs, output_names, emits)
        except BatchFailure as exc:
            return ("batch_error", str(exc))
        finally:
            del reqs
        results, arrays = _collect(raw)
        del raw
        out_block, descs = pack_tensors(arrays)
        del arrays
        name = None
        if out_block is not None:
            name = out_block.name
            out_block.close()
        return ("ok", name, descs, results)
    finally:
        if block is not None:
            try:
                block.close()
            except BufferError:
                gc.collect()  # a traceback cycle may still hold an input view
                try:
                    block.close()
                except BufferError:  # the model kept a view of an input; keep the mapping alive
                    leaked.append(block)


def _collect(
    raw: Sequence[dict[str, np.ndarray[Any, Any]] | pb_utils.TritonError],
) -> tuple[list[tuple[Any, ...]], dict[str, np.ndarray[Any, Any]]]:
    results: list[tuple[Any, ...]] = []
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    for i, item in enumerate(raw):
        if isinstance(item, pb_utils.TritonError):
            results.append(("error", item.code(), item.message()))
            continue
        bad = [n for n, a in item.items() if not isinstance(a, np.ndarray)]
        if bad:
            results.append(("error", pb_utils.TritonError.INTERNAL, f"outputs {bad} are not numpy arrays"))
            continue
        arrays.update({f"{i}/{n}": a for n, a in item.items()})
        results.append(("ok", list(item)))
    return results, arrays


def _error_from(code: int, message: str) -> Exception:
    return pb_utils.to_frameserve_error(pb_utils.TritonError(message, code), "BLS call")


# -- the server side -----------------------------------------------------------------------


class _WorkerDied(Exception):
    pass


def _shutdown(conn: multiprocessing.connection.Connection) -> None:
    """End both directions of the pipe's socket now (the worker reads EOF, a thread waiting on
    it wakes), before the descriptor is closed."""
    try:
        sock = socket.socket(fileno=os.dup(conn.fileno()))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()


class PythonProcessSession:
    """A ``TritonPythonModel`` run in a worker process of its own (see the module docstring
    and :class:`frameserve.backends.Session`); same interface as
    :class:`~frameserve.backends.python.PythonSession`, including ``run_requests``.

    Args:
        config: the model's config (``parameters.isolation: process``).
        model_file: the ``model.py``.
        threads: sets ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` in the worker unless already
            set (for frameworks the model imports).
        context: BLS ``infer`` (called in the server process), version, instance name.

    Raises:
        ModelConfigError: the worker cannot start, or the model fails to load there.
    """

    def __init__(self, config: ModelConfig, model_file: Path, *, threads: int, context: BackendContext) -> None:
        self._model_file = Path(model_file)
        self._threads = threads
        self._context = context
        self._batch: Sequence[InferRequest] = ()  # the requests the worker executes now (whose its BLS calls may be)
        self._lock = threading.Lock()
        self._name = config.name
        self._proc: Any = None
        self._chan: _Channel | None = None
        self._pending_unlink: list[str] = []
        self._pump: ResponsePump | None = None  # a decoupled model's reader of the pipe
        self._streams = StreamTable()
        self.config: ModelConfig = config  # completed from the model below
        self._closed = False
        self.restarts = 0
        self._stats = {"messages": 0, "pickled_bytes": 0, "largest_message_bytes": 0, "shm_bytes": 0, "bls_calls": 0}
        self._start()
        try:
            reply = self._call(("auto_complete", config.to_dict()))
            self.config = complete_python_config(config, reply[1])
            self.inputs: tuple[TensorSpec, ...] = self.config.inputs
            self.outputs: tuple[TensorSpec, ...] = self.config.outputs
            self.max_batch_size: int = int(self.config.max_batch_size or 0)
            self._args = initialize_args(self.config, self._model_file, context)
            self._call(("initialize", self._args))
            self._start_pump()
        except _WorkerDied as exc:
            raise ModelConfigError(f"model {self._name!r}: the worker process died while loading: {exc}") from None
        except BaseException:
            self._stop()
            raise
        self.info: dict[str, Any] = {
            "backend": "python",
            "isolation": "process",
            "precision": self.config.precision,
            "threads": threads,
            "device": "CPU",
            "performance_hint": None,
            "instance_name": self._args["model_instance_name"],
            "model_path": str(self._model_file),
            "pid": self.pid,
        }

    @property
    def pid(self) -> int | None:
        """The worker's process id (``None`` while none runs)."""
        return self._proc.pid if self._proc is not None and self._proc.is_alive() else None

    def transport_stats(self) -> dict[str, int]:
        """Counters of the pipe and shared memory: ``messages``, ``pickled_bytes``,
        ``largest_message_bytes`` (pipe, both ways), ``shm_bytes`` (tensor bytes written to or
        read from shared memory by this side), ``bls_calls``."""
        stats = dict(self._stats)
        if self._chan is not None:
            stats["messages"] += self._chan.messages
            stats["pickled_bytes"] += self._chan.pickled_bytes
            stats["largest_message_bytes"] = max(stats["largest_message_bytes"], self._chan.largest_message_bytes)
        return stats

    # -- worker lifecycle

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        proc = ctx.Process(
            target=worker_main,
            args=(child, str(self._model_file), self._name, self._threads),
            name=f"frameserve-python-{self._name}",
            daemon=True,
        )
        proc.start()
        child.close()
        self._proc, self._chan = proc, _Channel(parent)
        try:
            reply = self._recv(timeout_s=_START_TIMEOUT_S)
        except _WorkerDied as exc:
            self._stop()
            raise ModelConfigError(f"model {self._name!r}: the worker process did not start: {exc}") from None
        if reply[0] != "ready":
            self._stop()
            raise ModelConfigError(
                reply[2] if reply[0] == "error" else f"model {self._name!r}: bad worker reply {reply[0]!r}"
            )

    def _start_pump(self) -> None:
        """A decoupled model: from now on one thread reads the pipe (responses come any time)."""
        if self.config.decoupled and self._chan is not None and self._proc is not None:
            self._pump = ResponsePump(
                self._chan, self._proc.sentinel, self._streams, f"fs-python-{self._name}-responses", self._count_bytes
            )

    def _count_bytes(self, n: int) -> None:
        self._stats["shm_bytes"] += n

    def _take_tensors(self, block_name: str | None, descs: list[Desc]) -> dict[str, np.ndarray[Any, Any]]:
        """Copy the tensors the worker left in shared-memory block ``block_name`` (``None``: no
        block, all inline) out of it, count their bytes, and free the block."""
        block = open_block(block_name) if block_name else None
        try:
            tensors = unpack_tensors(block, descs, copy=True)
            self._count_bytes(sum(d[5] for d in descs))
        finally:
            if block is not None:
                block.close()
                block.unlink()
        return tensors

    def _stop(self) -> None:
        proc, chan, pump = self._proc, self._chan, self._pump
        self._proc = self._chan = self._pump = None
        if pump is not None and chan is not None:
            _shutdown(chan.conn)  # the worker and the pump both see the end of the pipe
            pump.join()
        if chan is not None:
            for key in ("messages", "pickled_bytes"):
                self._stats[key] += getattr(chan, key)
            self._stats["largest_message_bytes"] = max(self._stats["largest_message_bytes"], chan.largest_message_bytes)
            chan.conn.close()
        if proc is not None:
            proc.join(timeout=_FINALIZE_TIMEOUT_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
            proc.close()
        self._release()

    def _restart(self) -> None:
        self._stop()
        self.restarts += 1
        self._start()
        self._call(("initialize", self._args))
        self._start_pump()
        self.info["pid"] = self.pid

    # -- messages

    def _release(self) -> None:
        for name in self._pending_unlink:
            unlink_block(name)
        self._pending_unlink.clear()

    def _recv(self, timeout_s: float | None = None) -> tuple[Any, ...]:
        assert self._chan is not None and self._proc is not None
        if self._pump is not None:  # a decoupled model's pump reads the pipe
            try:
                msg = self._pump.inbox.get(timeout=timeout_s)
            except queue.Empty:
                raise _WorkerDied(f"no answer within {timeout_s} s") from None
            if msg is not DIED:
                return msg
            self._proc.join(timeout=1.0)
            raise _WorkerDied(f"worker process {self._proc.pid} exited with code {self._proc.exitcode}")
        ready = multiprocessing.connection.wait([self._chan.conn, self._proc.sentinel], timeout=timeout_s)
        if not ready:
            raise _WorkerDied(f"no answer within {timeout_s} s")
        if self._chan.conn in ready:
            try:
                return self._chan.recv()
            except (EOFError, OSError):
                pass
        self._proc.join(timeout=1.0)
        raise _WorkerDied(f"worker process {self._proc.pid} exited with code {self._proc.exitcode}")

    def _call(self, msg: tuple[Any, ...]) -> tuple[Any, ...]:
        """Send ``msg``, serve BLS calls until the answer comes; raise on an error answer."""
        assert self._chan is not None
        try:
            self._chan.send(msg)
            while True:
                reply = self._recv()
                self._release()
                if reply[0] != "bls":
                    break
                self._serve_bls(reply)
        except (_WorkerDied, BrokenPipeError, ConnectionResetError) as exc:
            self._stop()
            raise _WorkerDied(str(exc)) from None
        if reply[0] == "error":
            _, code, text = reply
            if code == "load" or msg[0] in ("auto_complete", "initialize"):
                raise ModelConfigError(text)
            raise InferenceError(f"model {self._name!r}: {text}")
        return reply

    def _serve_bls(self, msg: tuple[Any, ...]) -> None:
        assert self._chan is not None
        _, (model, version, outputs, parameters, request_id, sequence, tenant), block_name, descs = msg
        self._stats["bls_calls"] += 1
        inputs = self._take_tensors(block_name, descs)
        infer = self._context.infer
        try:
            if infer is None:
                raise pb_utils.TritonModelException(
                    "BLS needs the server's infer (BackendContext.infer); this session has none"
                )
            check_claimed(self._batch, tenant)
            result = infer(
                InferRequest(
                    model_name=model,
                    inputs=inputs,
                    model_version=version,
                    outputs=tuple(RequestedOutput(n) for n in outputs or ()),
                    parameters=parameters,
                    id=request_id,
                    sequence_id=sequence[0],
                    sequence_start=sequence[1],
                    sequence_end=sequence[2],
                    tenant=tenant,
                )
            )
        except Exception as exc:
            err = pb_utils.from_exception(exc)
            self._chan.send(("bls_error", err.code(), err.message()))
            return
        out, out_descs = pack_tensors(result)
        name = None
        if out is not None:
            name = out.name
            self._stats["shm_bytes"] += sum(d[5] for d in out_descs)
            out.close()
            self._pending_unlink.append(name)  # the worker copies it before its next message
        self._chan.send(("bls_ok", name, out_descs))

    # -- Session

    def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        """Run one request; see :meth:`frameserve.backends.python.PythonSession.run`.

        Raises:
            InferenceError: ``execute`` failed, or the worker died (it restarts on the next request).
        """
        return run_one(self.run_requests, self._name, inputs)

    def run_requests(
        self, requests: Sequence[InferRequest | Mapping[str, np.ndarray[Any, Any]]]
    ) -> list[dict[str, np.ndarray[Any, Any]] | Exception]:
        """Run several requests in one ``execute`` call in the worker; see
        :meth:`frameserve.backends.python.PythonSession.run_requests`.

        Raises:
            InferenceError: ``execute`` failed as a whole, or the worker died while running it
                (the next request starts a new worker).
        """
        reqs = [as_request(r, self._name) for r in requests]
        with self._lock:
            if self._closed:
                raise InferenceError(f"model {self._name!r}: the session is closed")
            if self._chan is None:
                try:
                    self._restart()
                except (_WorkerDied, FrameserveError) as exc:
                    self._stop()
                    raise InferenceError(f"model {self._name!r}: restarting the worker process failed: {exc}") from None
            tensors = {f"{i}/{n}": a for i, r in enumerate(reqs) for n, a in r.inputs.items()}
            block, descs = pack_tensors(tensors)
            by_request: list[list[Desc]] = [[] for _ in reqs]
            for d in descs:
                index, name = d[0].split("/", 1)
                by_request[int(index)].append((name, *d[1:]))
            self._stats["shm_bytes"] += sum(d[5] for d in descs)
            payload = [
                (
                    by_request[i],
                    r.output_names,
                    dict(r.parameters),
                    r.id,
                    (r.sequence_id, r.sequence_start, r.sequence_end),
                    r.tenant,
                )
                for i, r in enumerate(reqs)
            ]
            if block is not None:
                block.close()
                self._pending_unlink.append(block.name)
            decoupled = self.config.decoupled
            tokens = [self._streams.open(stream_emit(self.config, r)) for r in reqs] if decoupled else None
            self._batch = reqs
            try:
                reply = self._call(
                    ("execute", block.name if block else None, payload, [s.name for s in self.outputs], tokens)
                )
            except _WorkerDied as exc:
                if tokens:
                    self._streams.drop(tokens)  # the pump ended those that reached the worker
                raise InferenceError(
                    f"model {self._name!r}: the Python model's worker process died while executing "
                    f"({exc}); the next request restarts it"
                ) from None
            finally:
                self._batch = ()
        if reply[0] == "batch_error":  # a decoupled model's open requests were ended with it
            raise InferenceError(f"model {self._name!r}: {reply[1]}")
        if decoupled:  # the responses come through the pump
            return [{} for _ in reqs]
        _, out_name, out_descs, results = reply
        arrays = self._take_tensors(out_name, out_descs)
        raw: list[dict[str, np.ndarray[Any, Any]] | pb_utils.TritonError] = []
        for i, item in enumerate(results):
            if item[0] == "error":
                raw.append(pb_utils.TritonError(item[2], item[1]))
            else:
                raw.append({n: arrays[f"{i}/{n}"] for n in item[1]})
        return finish_results(self.config, reqs, raw)

    def close(self) -> None:
        """Call the model's ``finalize()`` in the worker and stop it (killed if it does not
        stop within 10 s)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._chan is not None:
                try:
                    self._chan.send(("finalize",))
                    self._recv(timeout_s=_FINALIZE_TIMEOUT_S)
                except (_WorkerDied, OSError, EOFError):
                    pass
            self._stop()

    def __repr__(self) -> str:
        return f"PythonProcessSession({self._name!r}, pid={self.pid})"
