"""``serve --grpc-cpus``: the gRPC server's Python threads (its poll thread, the pool, the helper
loop) run on the CPUs given, and nothing else changes CPUs (the caller, the model's instance
thread), checked on the kernel's own affinity of each thread while real calls are served."""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from _models import add_model

from frameserve.protocol.grpc import bound_port, create_server
from frameserve.repository import ModelRepository
from frameserve.service import InferenceService

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import tritonclient.grpc as tc

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="thread CPU affinity is Linux-only"),
]

ALLOWED = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()


@pytest.fixture
def service(tmp_path: Path) -> Iterator[InferenceService]:
    add_model(tmp_path / "add" / "1" / "model.onnx")
    svc = InferenceService(ModelRepository(tmp_path), threads=1)
    svc.load("add")
    yield svc
    svc.close()


def _calls(port: int, n: int) -> None:
    """``n`` clients at once, so the pool starts several threads; each answer checked."""
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            client = tc.InferenceServerClient(url=f"127.0.0.1:{port}")
            a = np.full((1, 4), float(i), np.float32)
            b = np.ones((1, 4), np.float32)
            inputs = [tc.InferInput("a", [1, 4], "FP32"), tc.InferInput("b", [1, 4], "FP32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            for _ in range(5):
                out = client.infer("add", inputs).as_numpy("sum")
                assert np.array_equal(out, a + b)
            client.close()
        except BaseException as exc:  # noqa: BLE001 - reported on the test thread
            errors.append(exc)

    workers = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert not errors, errors


def _served_by_grpc(before: set[int | None]) -> list[threading.Thread]:
    """The threads the server started: its pool and helper loop (``frameserve-grpc...``) and
    gRPC's poll thread (``Thread-N (_serve)``)."""
    return [
        t
        for t in threading.enumerate()
        if t.ident not in before and (t.name.startswith("frameserve-grpc") or t.name.endswith("(_serve)"))
    ]


def test_the_servers_python_threads_run_on_the_cpus_given(service: InferenceService) -> None:
    cpu = max(ALLOWED)
    before = {t.ident for t in threading.enumerate()}
    server = create_server(service, "127.0.0.1:0", cpus=frozenset({cpu}))
    server.start()
    try:
        _calls(bound_port(server), 4)
        started = _served_by_grpc(before)
        names = sorted(t.name for t in started)
        assert any(n.endswith("(_serve)") for n in names), names
        assert any(n.startswith("frameserve-grpc_") for n in names), names  # pool threads
        assert "frameserve-grpc-loop" in names
        for t in started:
            assert t.native_id is not None
            assert os.sched_getaffinity(t.native_id) == {cpu}, t.name
        assert os.sched_getaffinity(0) == ALLOWED  # the caller's thread keeps its CPUs
        instances = [t for t in threading.enumerate() if t.name.startswith("fs-add-")]
        assert instances
        for t in instances:  # the model's threads are not the server's to move
            assert t.native_id is not None
            assert os.sched_getaffinity(t.native_id) == ALLOWED, t.name
    finally:
        server.stop(1)


def test_without_cpus_nothing_is_pinned(service: InferenceService) -> None:
    before = {t.ident for t in threading.enumerate()}
    server = create_server(service, "127.0.0.1:0")
    server.start()
    try:
        _calls(bound_port(server), 2)
        started = _served_by_grpc(before)
        assert started
        for t in started:
            assert t.native_id is not None
            assert os.sched_getaffinity(t.native_id) == ALLOWED, t.name
    finally:
        server.stop(1)


def test_a_cpu_the_process_may_not_use_fails_the_start(service: InferenceService) -> None:
    server = create_server(service, "127.0.0.1:0", cpus=frozenset({max(ALLOWED) + 4096}))
    with pytest.raises(OSError):
        server.start()
    assert os.sched_getaffinity(0) == ALLOWED
