"""The front-end processes of ``serve --http-workers N --grpc-workers N``: :class:`FrontendPool`.

Why: one Python process serves HTTP and gRPC on one event loop, under one interpreter lock, so
a small model's throughput stops at one core whatever the machine has. With N > 1 the
listeners move to front-end processes (:mod:`frameserve.server._frontend`), each binding the
same ports (``SO_REUSEPORT``: Linux spreads new connections over them; the owner holds each
port with a bound socket that never listens, so a restarting front end never loses it), and
this process keeps the models: every front end hands its requests to it over a channel of its
own (:mod:`frameserve.server._channel`: a socket pair for messages, shared memory for tensors),
so one batcher per model sees every request and the system shared-memory regions clients
register are the same for every connection.

Process ``i`` (``0 <= i < max(N_http, N_grpc)``) serves HTTP when ``i < N_http`` and gRPC when
``i < N_grpc``. The metrics port stays with this process.

A front end that dies (``kill -9``, a crash) is logged and replaced within a second; one that
dies :data:`MAX_QUICK_DEATHS` times in a row within :data:`QUICK_DEATH_S` of its start (it
cannot bind, it crashes at once) makes the server fail loudly: ``on_fatal`` is called (the
server stops, ``frameserve serve`` exits 1 naming the cause). Linux only (``SO_REUSEPORT``
load balancing, ``memfd_create``).
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from frameserve.repository import InputSignature
from frameserve.server import _channel as ch
from frameserve.server._frontend import FrontendConfig
from frameserve.server._owner import FrontendLink
from frameserve.server._ports import bind_reuseport
from frameserve.service import InferenceService

__all__ = ["MAX_QUICK_DEATHS", "QUICK_DEATH_S", "FrontendPool", "reserve_port"]

log = logging.getLogger("frameserve.server")

MAX_QUICK_DEATHS = 3
"""Front-end deaths in a row, each within :data:`QUICK_DEATH_S` of its start, that stop the server."""

QUICK_DEATH_S = 10.0
"""A front end dying sooner than this after it started counts towards :data:`MAX_QUICK_DEATHS`."""

UP_TIMEOUT_S = 60.0
"""How long a new front end may take to listen before it is killed."""

_ACK_TIMEOUT_S = 5.0


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` with ``SO_REUSEPORT`` that never listens: it holds the
    port (port 0: picks one) for the front ends, which bind it beside it, and takes no
    connection itself."""
    return bind_reuseport(host, port)


class _Slot:
    """One front end's place in the pool: the process now in it and its link."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: subprocess.Popen[bytes] | None = None
        self.link: FrontendLink | None = None
        self.started = 0.0
        self.quick_deaths = 0


class FrontendPool:
    """Starts, watches, restarts and stops the front ends (see the module docstring).

    Args:
        service: the service requests run on.
        configs: one :class:`~frameserve.server._frontend.FrontendConfig` per front end.
        link_options: passed to each :class:`~frameserve.server._owner.FrontendLink`
            (``shared_memory``, ``loop``, ``http_app``, ``grpc_servicer``, ``grpc_health``).
        arena_bytes: shared memory per front end.
        ready_of: whether the server is ready now (published with the models; a front end
            answers ``/v2/health/ready`` with it).
        on_fatal: called with the reason when front ends keep dying.
    """

    def __init__(
        self,
        service: InferenceService,
        configs: list[FrontendConfig],
        *,
        link_options: dict[str, Any],
        arena_bytes: int = ch.DEFAULT_ARENA_BYTES,
        ready_of: Callable[[], bool],
        on_fatal: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self.service = service
        self.ready_of = ready_of
        self.configs = configs
        self.link_options = link_options
        self.arena_bytes = arena_bytes
        self.on_fatal = on_fatal
        self._slots = [_Slot(i) for i in range(len(configs))]
        self._lock = threading.Lock()
        self._generation = 0
        self._models = ch.Models(0, {}, {}, False)
        self._stopping = False
        self._publish_lock = threading.Lock()

    # -- public ------------------------------------------------------------------------------

    @property
    def pids(self) -> list[int | None]:
        """The process id of each front end that listens now (``None`` for one being replaced)."""
        return [
            slot.proc.pid
            if slot.proc is not None and slot.link is not None and slot.link.up.is_set() and slot.proc.poll() is None
            else None
            for slot in self._slots
        ]

    def start(self, timeout_s: float = UP_TIMEOUT_S) -> None:
        """Start every front end and wait until each listens.

        Raises:
            RuntimeError: one exited or did not listen within ``timeout_s``.
        """
        for slot in self._slots:
            self._spawn(slot)
        deadline = time.monotonic() + timeout_s
        for slot in self._slots:
            link, proc = slot.link, slot.proc
            assert link is not None and proc is not None
            while not link.up.wait(0.05):
                if proc.poll() is not None:
                    raise RuntimeError(f"front end {slot.index} exited with {proc.returncode} before it listened")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"front end {slot.index} did not listen within {timeout_s} s")

    def publish(self) -> None:
        """Tell every front end which model versions are loaded now and whether the server is
        ready, and wait until each has it (so a load or unload is answered only once every
        front end acts on it)."""
        with self._publish_lock:
            with self._lock:
                self._generation += 1
                generation = self._generation
                message = self._models = _loaded(generation, self.service, self.ready_of())
                links = [s.link for s in self._slots if s.link is not None]
            for link in links:
                link.send(message)
            for link in links:
                if not link.wait_ack(generation, _ACK_TIMEOUT_S):
                    log.warning("front end %d did not take the new model list within %s s", link.index, _ACK_TIMEOUT_S)

    def stop(self, grace_s: float | None) -> None:
        """Stop every front end: in-flight requests finish (up to ``grace_s``), then each exits;
        one still running 5 s later is killed."""
        with self._lock:
            self._stopping = True
            slots = list(self._slots)
        for slot in slots:
            if slot.link is not None:
                slot.link.send(ch.Stop(grace_s))
        deadline = time.monotonic() + (grace_s if grace_s is not None else 3600.0) + 5.0
        for slot in slots:
            proc = slot.proc
            if proc is None:
                continue
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("front end %d (pid %d) did not stop; killing it", slot.index, proc.pid)
                proc.kill()
                proc.wait(10)
        for slot in slots:
            if slot.link is not None:
                slot.link.close()

    # -- internals ---------------------------------------------------------------------------

    def _spawn(self, slot: _Slot) -> None:
        config = self.configs[slot.index]
        owner_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        block = ch.SharedBlock(self.arena_bytes)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "frameserve.server._frontend_main", str(child_end.fileno()), str(block.fd)],
                pass_fds=(child_end.fileno(), block.fd),
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except BaseException:
            owner_end.close()
            block.close()
            raise
        finally:
            child_end.close()
        link = FrontendLink(slot.index, owner_end, block, self.service, publish=self.publish, **self.link_options)
        with self._lock:
            slot.proc, slot.link, slot.started = proc, link, time.monotonic()
            models = self._models
        link.start(ch.Hello(config))
        link.send(models)
        threading.Thread(
            target=self._watch, args=(slot, proc, link), name=f"frameserve-frontend-watch-{slot.index}", daemon=True
        ).start()

    def _watch(self, slot: _Slot, proc: subprocess.Popen[bytes], link: FrontendLink) -> None:
        deadline = time.monotonic() + UP_TIMEOUT_S
        while not link.up.wait(0.1) and proc.poll() is None:
            if time.monotonic() > deadline:
                log.error(
                    "front end %d (pid %d) did not listen within %s s; killing it", slot.index, proc.pid, UP_TIMEOUT_S
                )
                proc.kill()
                break
        code = proc.wait()
        link.close()
        with self._lock:
            if self._stopping:
                return
            lived = time.monotonic() - slot.started
            slot.quick_deaths = slot.quick_deaths + 1 if lived < QUICK_DEATH_S else 0
            fatal = slot.quick_deaths >= MAX_QUICK_DEATHS
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        if fatal:
            reason = (
                f"front end {slot.index} died {slot.quick_deaths} times in a row within {QUICK_DEATH_S:.0f} s "
                f"of its start (last: {how})"
            )
            log.critical("%s; stopping the server", reason)
            self.on_fatal(reason)
            return
        log.error(
            "front end %d (pid %d) ended with %s after %.1f s; starting a new one", slot.index, proc.pid, how, lived
        )
        time.sleep(min(1.0, 0.1 * 2**slot.quick_deaths))
        with self._lock:
            if self._stopping:
                return
        try:
            self._spawn(slot)
        except Exception as exc:  # noqa: BLE001 - reported as fatal
            log.critical("front end %d cannot be restarted: %s", slot.index, exc)
            self.on_fatal(f"front end {slot.index} cannot be restarted: {exc}")


def _loaded(generation: int, service: InferenceService, ready: bool) -> ch.Models:
    """The :class:`~frameserve.server._channel.Models` message of ``service`` now: ``{model:
    loaded versions}``, each version's input signature, and ``ready``."""
    out: dict[str, tuple[int, ...]] = {}
    signatures: dict[tuple[str, int], InputSignature] = {}
    for name in service.model_names():
        try:
            versions = tuple(int(v) for v in service.metadata(name)["versions"])
            for version in versions:
                signatures[(name, version)] = service.input_signature(name, version)
        except Exception:  # unloaded meanwhile
            continue
        out[name] = versions
    return ch.Models(generation, out, signatures, ready)
