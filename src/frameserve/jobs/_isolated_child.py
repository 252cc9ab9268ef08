"""The child side of :class:`~frameserve.jobs._isolated.IsolatedPipeline`: the process's entry
point (:func:`child_main`) and the stand-in for the parent's service it runs pipelines over
(:class:`RemoteService`). The channel (messages, shared block, progress counters) is described in
:mod:`frameserve.jobs._isolated`, the parent side, which starts this module's :func:`child_main`.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import signal
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from frameserve._ipc import Arena, SharedBlock, pack_tensors, picklable_error, unpack_tensors

if TYPE_CHECKING:
    import ctypes
    from multiprocessing.connection import Connection
    from typing import TypeAlias

    from frameserve.config import Settings
    from frameserve.repository import ModelConfig
    from frameserve.request import InferRequest
    from frameserve.service import InferenceService

    # One end of the pipe: tuples whose first item is the kind (the table in the docstring of
    # frameserve.jobs._isolated); the other items are whatever that kind carries, unpickled (hence Any).
    Pipe: TypeAlias = Connection[tuple[Any, ...], tuple[Any, ...]]
    # The shared [frames done, frames expected] (-1: none).
    Counters: TypeAlias = ctypes.Array[ctypes.c_longlong]

__all__ = ["RemoteService", "child_main"]


class RemoteService:
    """The child's stand-in for the parent's :class:`~frameserve.service.InferenceService`:
    ``submit`` and ``infer`` send the request to the parent; ``is_ready``, ``load``,
    ``register``, ``model_config``, ``session_info`` and ``metadata`` are calls answered there.

    Args:
        conn: the child's end of the pipe.
        threads: the parent service's thread budget (``threads``).
        repository_root: the parent's model repository folder, or ``None``.
        block: the shared block tensors cross in (this side writes its request half).
    """

    def __init__(self, conn: Pipe, threads: int | None, repository_root: str | None, block: SharedBlock) -> None:
        from frameserve.repository import ModelRepository

        self.threads = threads
        self._block = block
        self._arena = Arena(*block.request_half)
        self._taken: dict[int, list[int]] = {}
        self.repository = ModelRepository(Path(repository_root)) if repository_root else None
        self._conn = conn
        self._send_lock = threading.Lock()
        self._pending: dict[int, Future[Any]] = {}  # Any: an answer unpickled from the pipe
        self._next = 0
        self._lock = threading.Lock()
        self.jobs: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
        threading.Thread(target=self._read, name="frameserve-pipeline-reader", daemon=True).start()

    def send(self, message: tuple[Any, ...]) -> None:
        """Send one message to the parent."""
        with self._send_lock:
            self._conn.send(message)

    def _read(self) -> None:
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):  # the parent is gone: nothing more to do
                os._exit(0)
            kind = message[0]
            if kind in ("result", "outputs"):
                with self._lock:
                    future = self._pending.pop(message[1], None)
                    taken = self._taken.pop(message[1], ())
                for offset in taken:  # the parent is done with the inputs
                    self._arena.free(offset)
                if future is None:
                    continue
                if kind == "outputs":
                    views = unpack_tensors(message[2], self._block)
                    outputs = {k: np.array(v) for k, v in views.items()}  # copied out of the block
                    del views
                    if message[3]:
                        self.send(("free", message[3]))
                    future.set_result(outputs)
                elif message[2]:
                    future.set_result(message[3])
                else:
                    future.set_exception(message[3])
            elif kind in ("job", "short"):
                self.jobs.put(message)
            else:  # "stop"
                self.jobs.put(None)

    def _ask(self, message: tuple[Any, ...], taken: list[int] | None = None) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            cid = self._next = self._next + 1
            self._pending[cid] = future
            if taken:
                self._taken[cid] = taken
        self.send((message[0], cid, *message[1:]))
        return future

    def submit(self, request: InferRequest) -> Future[Any]:
        """Queue one :class:`~frameserve.request.InferRequest` in the parent (its inputs copied
        into the shared block); its outputs' future."""
        specs, taken = pack_tensors(request.inputs, self._block, self._arena)
        return self._ask(("submit", dataclasses.replace(request, inputs={}), specs), taken)

    def infer(self, name: str, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        """Run model ``name`` on ``inputs`` in the parent and wait: ``{output name: array}``."""
        from frameserve.request import InferRequest

        outputs: dict[str, np.ndarray[Any, Any]] = self.submit(InferRequest(name, inputs)).result()
        return outputs

    def _call(self, method: str, *args: object, **kwargs: object) -> Any:  # Any: the parent's answer, unpickled
        return self._ask(("call", method, args, kwargs)).result()

    def is_ready(self, name: str) -> bool:
        """As the parent service's ``is_ready``."""
        return bool(self._call("is_ready", name))

    def load(self, name: str, **kwargs: object) -> list[int]:
        """As the parent service's ``load``."""
        versions: list[int] = self._call("load", name, **kwargs)
        return versions

    def register(self, name: str, path: Path, **kwargs: object) -> ModelConfig:
        """As the parent service's ``register``."""
        config: ModelConfig = self._call("register", name, path, **kwargs)
        return config

    def model_config(self, name: str) -> ModelConfig:
        """As the parent service's ``model_config``."""
        config: ModelConfig = self._call("model_config", name)
        return config

    def session_info(self, name: str) -> dict[str, Any]:
        """As the parent service's ``session_info``."""
        info: dict[str, Any] = self._call("session_info", name)
        return info

    def metadata(self, name: str) -> dict[str, Any]:
        """As the parent service's ``metadata``."""
        meta: dict[str, Any] = self._call("metadata", name)
        return meta

    def close(self) -> None:
        """Nothing to close: the parent owns the models."""


def child_main(
    conn: Pipe,
    settings: Settings,
    folder: str | None,
    threads: int | None,
    repository_root: str | None,
    memory_limit_bytes: int | None,
    counters: Counters,
    warm: bool = False,
) -> None:
    """The child process: run each job the parent sends, until ``("stop",)`` or the pipe closes;
    ``counters`` is the shared ``[frames done, frames expected]`` (``-1``: none); ``warm``: start
    the decode process now, before the first job (a job child; a short-clip child never uses it).
    The parent sends two descriptors first: the crash file (faulthandler's, held open until the
    process ends), then the shared block."""
    import faulthandler
    from multiprocessing.reduction import recv_handle

    if memory_limit_bytes is not None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
    faulthandler.enable(file=recv_handle(conn), all_threads=True)  # the crash file's descriptor
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when this process stops
    from frameserve.jobs._pipeline import pipeline_process
    from frameserve.pipeline import DecodePool
    from frameserve.pipeline.registry import PipelineRegistry

    block = SharedBlock(fd=recv_handle(conn))  # the shared block's descriptor
    remote = RemoteService(conn, threads, repository_root, block)
    service = cast("InferenceService", remote)  # the stand-in: the calls the runner makes, answered by the parent
    pool = DecodePool(1)
    if warm:
        pool.warm()
    registry = PipelineRegistry(Path(folder) if folder else None)
    process = pipeline_process(settings, service, None, decode_pool=pool, pipelines=registry)
    remote.send(("ready",))  # set up (and the decode process started when warm): jobs may come

    def progress(done: int | None, expected: int | None) -> None:
        counters[1] = -1 if expected is None else expected  # expected first: a reader never sees a
        counters[0] = -1 if done is None else done  # count newer than the total it belongs to

    try:
        while (work := remote.jobs.get()) is not None:
            try:
                if work[0] == "job":
                    _, video, spec, workdir = work
                    summary, files = process(Path(video), spec, Path(workdir), progress)
                    remote.send(("done", summary, {k: str(v) for k, v in files.items()}))
                else:  # ("short", clip, pipeline, params, max_duration_s, flag)
                    from frameserve.pipeline.runner import RunSpec, run

                    _, clip, name, params, max_duration_s, flag = work
                    spec = RunSpec(short=True, params=params, max_duration_s=max_duration_s, max_duration_flag=flag)
                    result = run(
                        Path(clip), registry.resolve(name), spec, service=service, settings=settings, progress=progress
                    )
                    remote.send(("done", {**result, "frames": list(result["frames"])}, None))
            except BaseException as exc:  # noqa: BLE001 - every failure goes to the parent
                remote.send(("failed", picklable_error(exc)))
    finally:
        pool.close()
