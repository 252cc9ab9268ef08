"""The python backend on a Triton-style repository (tests/data/triton_repo: config.pbtxt +
model.py written in Triton's documented form), in process and in worker processes."""

from __future__ import annotations

import dataclasses
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from frameserve import pb_utils
from frameserve.backends import BackendContext, Session, load_session
from frameserve.errors import InferenceError, InvalidInputError, ModelConfigError, NotFoundError
from frameserve.repository import ModelRepository
from frameserve.request import InferRequest, RequestedOutput

TRITON_REPO = Path(__file__).resolve().parents[1] / "data" / "triton_repo"
MODELS = ("add_sub", "add_onnx", "bls", "bls_async", "checked_sqrt", "auto_complete", "identity", "crasher")

IDENTITY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""
CRASHER = """
import os
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()
        if x[0] == 13:
            os._exit(3)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)])]
"""
XY_CONFIG = (
    'backend: "python"\ninput [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
)


def _add_sub_onnx(path: Path) -> None:
    """INPUT0, INPUT1 FP32 [4] -> OUTPUT0 = sum, OUTPUT1 = difference (the ONNX twin of add_sub)."""
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("INPUT0", "INPUT1")]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("OUTPUT0", "OUTPUT1")]
    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "add_sub", ins, outs), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    path.parent.mkdir(parents=True)
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def repo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("triton_repo")
    shutil.copytree(TRITON_REPO, root, dirs_exist_ok=True)
    _add_sub_onnx(root / "add_onnx" / "1" / "model.onnx")
    (root / "add_onnx" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\nmax_batch_size: 0\n')
    for name, code in (("identity", IDENTITY), ("crasher", CRASHER)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(code)
        (root / name / "config.pbtxt").write_text(XY_CONFIG)
    return root


class Server:
    """The smallest dispatcher: loads sessions and routes BLS calls to them (as the service does)."""

    def __init__(self, root: Path, isolation: str) -> None:
        self.repo = ModelRepository(root)
        self.sessions: dict[str, Session] = {}
        for name in MODELS:
            if name == "crasher" and isolation != "process":
                continue  # os._exit would end the test process itself
            cfg = self.repo.config(name)
            if cfg.backend == "python":
                cfg = dataclasses.replace(cfg, parameters={**cfg.parameters, "isolation": isolation})
            (version,) = self.repo.versions(name)
            context = BackendContext(
                infer=self.infer, model_repository=root / name, model_version=version, instance_name=f"{name}_0"
            )
            self.sessions[name] = load_session(
                cfg, self.repo.model_file(name, version, config=cfg), threads=1, context=context
            )

    def infer(self, request: InferRequest) -> dict[str, np.ndarray[Any, Any]]:
        """The ``infer`` a server injects (``BackendContext.infer``): one InferRequest per BLS call."""
        if request.model_name not in self.sessions:
            raise NotFoundError(f"no model {request.model_name!r}")
        result = self.sessions[request.model_name].run(request.inputs)
        return {n: result[n] for n in (request.output_names or result)}

    def close(self) -> None:
        for s in self.sessions.values():
            s.close()


@pytest.fixture(scope="module", params=["in_process", "process"])
def server(request: pytest.FixtureRequest, repo_dir: Path) -> Iterator[Server]:
    srv = Server(repo_dir, request.param)
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def both(repo_dir: Path) -> Iterator[tuple[Server, Server]]:
    a, b = Server(repo_dir, "in_process"), Server(repo_dir, "process")
    yield a, b
    a.close()
    b.close()


A = np.array([1.5, -2.0, 3.25, 0.0], dtype=np.float32)
B = np.array([0.5, 4.0, -1.0, 7.0], dtype=np.float32)


def test_add_sub_computes_sum_and_difference(server: Server) -> None:
    out = server.sessions["add_sub"].run({"INPUT0": A, "INPUT1": B})
    assert set(out) == {"OUTPUT0", "OUTPUT1"}
    np.testing.assert_array_equal(out["OUTPUT0"], A + B)
    np.testing.assert_array_equal(out["OUTPUT1"], A - B)
    assert out["OUTPUT0"].dtype == np.float32
    session = server.sessions["add_sub"]
    assert isinstance(session, Session)
    assert session.config.max_batch_size == 0 and session.max_batch_size == 0
    assert session.info["backend"] == "python"


@pytest.mark.parametrize("target", ["add_sub", "add_onnx"])
def test_bls_calls_another_model(server: Server, target: str) -> None:
    out = server.sessions["bls"].run(
        {"MODEL_NAME": np.array([target.encode()], dtype=object), "INPUT0": A, "INPUT1": B}
    )
    np.testing.assert_array_equal(out["OUTPUT0"], A + B)
    np.testing.assert_array_equal(out["OUTPUT1"], A - B)


def test_bls_to_an_unknown_model_fails_the_batch_with_the_reason(server: Server) -> None:
    with pytest.raises(InferenceError, match="no model 'nope'"):
        server.sessions["bls"].run({"MODEL_NAME": np.array([b"nope"], dtype=object), "INPUT0": A, "INPUT1": B})


def test_async_bls_with_two_calls_in_flight(server: Server) -> None:
    out = server.sessions["bls_async"].run({"INPUT0": A, "INPUT1": B})
    np.testing.assert_array_equal(out["OUTPUT0"], A + B)
    np.testing.assert_array_equal(out["OUTPUT1"], B - A)


def test_error_response_fails_only_its_request(server: Server) -> None:
    session = server.sessions["checked_sqrt"]
    results = session.run_requests(
        [  # type: ignore[attr-defined]
            {"X": np.array([[4.0, 9.0]], np.float32)},
            {"X": np.array([[-1.0, 1.0]], np.float32)},
            {"X": np.array([[16.0], [25.0]], np.float32)},
        ]
    )
    assert len(results) == 3
    np.testing.assert_array_equal(results[0]["Y"], [[2.0, 3.0]])
    assert isinstance(results[1], InvalidInputError)
    assert "X must not be negative" in str(results[1]) and "checked_sqrt" in str(results[1])
    np.testing.assert_array_equal(results[2]["Y"], [[4.0], [5.0]])
    with pytest.raises(InvalidInputError, match="negative"):
        session.run({"X": np.array([[-4.0]], np.float32)})


def test_exception_in_execute_fails_the_whole_batch(server: Server) -> None:
    with pytest.raises(InferenceError, match="TritonModelException: X holds NaN"):
        server.sessions["checked_sqrt"].run_requests(
            [  # type: ignore[attr-defined]
                {"X": np.array([[1.0]], np.float32)},
                {"X": np.array([[np.nan]], np.float32)},
            ]
        )
    out = server.sessions["checked_sqrt"].run({"X": np.array([[1.0]], np.float32)})  # still serving
    np.testing.assert_array_equal(out["Y"], [[1.0]])


def test_auto_complete_config_args_parameters_and_output_selection(server: Server, repo_dir: Path) -> None:
    import json

    session = server.sessions["auto_complete"]
    cfg = session.config
    assert cfg.max_batch_size == 4 and cfg.dynamic_batching == {}
    assert [(s.name, s.datatype.value, s.dims) for s in cfg.inputs] == [("IN", "INT32", (3,))]
    assert [s.name for s in cfg.outputs] == ["OUT", "INFO"]
    x = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    only_out, both = session.run_requests(
        [  # type: ignore[attr-defined]
            InferRequest(
                "auto_complete", {"IN": x}, outputs=(RequestedOutput("OUT"),), id="r-1"
            ),  # as the scheduler passes
            InferRequest("auto_complete", {"IN": x[:1]}, parameters={"threshold": 0.5, "tag": "a"}, id="r-2"),
        ]
    )
    assert list(only_out) == ["OUT"]
    np.testing.assert_array_equal(only_out["OUT"], x * 2)
    info = json.loads(both["INFO"][0, 0])
    assert info["request_id"] == "r-2"
    assert info["parameters"] == {"threshold": 0.5, "tag": "a"}
    assert info["requested"] == ["OUT", "INFO"]
    assert info["model_dir"] == str(repo_dir / "auto_complete" / "1")
    assert info["args"] == {
        "model_instance_kind": "CPU",
        "model_instance_name": "auto_complete_0",
        "model_instance_device_id": "0",
        "model_repository": str(repo_dir / "auto_complete"),
        "model_version": "1",
        "model_name": "auto_complete",
    }


def test_in_process_and_process_outputs_are_equal(both: tuple[Server, Server]) -> None:
    rng = np.random.default_rng(0)
    local, isolated = both
    for _ in range(3):
        a, b = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
        for name, inputs in (
            ("add_sub", {"INPUT0": a, "INPUT1": b}),
            ("bls", {"MODEL_NAME": np.array([b"add_onnx"], dtype=object), "INPUT0": a, "INPUT1": b}),
            ("bls_async", {"INPUT0": a, "INPUT1": b}),
            ("checked_sqrt", {"X": np.abs(rng.standard_normal((3, 5))).astype(np.float32)}),
        ):
            x, y = local.sessions[name].run(inputs), isolated.sessions[name].run(inputs)
            assert set(x) == set(y)
            for key in x:
                assert x[key].dtype == y[key].dtype and x[key].shape == y[key].shape
                assert x[key].tobytes() == y[key].tobytes(), (name, key)


def test_in_process_hands_arrays_over_without_copies(both: tuple[Server, Server]) -> None:
    x = np.arange(5, dtype=np.float32)
    assert both[0].sessions["identity"].run({"X": x})["Y"] is x
    y = both[1].sessions["identity"].run({"X": x})["Y"]
    np.testing.assert_array_equal(y, x)
    assert not np.shares_memory(x, y)


def test_process_isolation_moves_tensors_through_shared_memory(both: tuple[Server, Server]) -> None:
    session: Any = both[1].sessions["checked_sqrt"]
    before = session.transport_stats()
    x = np.full((1, 1 << 18), 4.0, np.float32)  # 1 MiB in, 1 MiB out
    out = session.run({"X": x})
    np.testing.assert_array_equal(out["Y"], np.full_like(x, 2.0))
    after = session.transport_stats()
    assert after["shm_bytes"] - before["shm_bytes"] >= 2 * x.nbytes
    assert after["largest_message_bytes"] < 16 * 1024  # no tensor went over the pipe
    assert after["pickled_bytes"] - before["pickled_bytes"] < 16 * 1024
    # BLS results too: inputs and outputs of the called model cross as shared memory
    bls: Any = both[1].sessions["bls"]
    calls = bls.transport_stats()["bls_calls"]
    bls.run({"MODEL_NAME": np.array([b"add_sub"], dtype=object), "INPUT0": A, "INPUT1": B})
    assert bls.transport_stats()["bls_calls"] == calls + 1


def test_the_pipe_refuses_arrays() -> None:
    import multiprocessing

    from frameserve.backends.python.process import _Channel

    a, b = multiprocessing.Pipe()
    try:
        with pytest.raises(InferenceError, match="shared memory"):
            _Channel(a).send(("execute", [np.zeros(3)]))
        _Channel(a).send(("ok", [1, "x"]))
        assert _Channel(b).recv() == ("ok", [1, "x"])
    finally:
        a.close()
        b.close()


def test_a_crashed_worker_fails_its_request_and_restarts(both: tuple[Server, Server]) -> None:
    session: Any = both[1].sessions["crasher"]
    first_pid = session.pid
    assert first_pid is not None
    np.testing.assert_array_equal(session.run({"X": np.array([1.0], np.float32)})["Y"], [2.0])
    with pytest.raises(InferenceError, match=r"died while executing.*exited with code 3.*restarts"):
        session.run({"X": np.array([13.0], np.float32)})
    assert session.pid is None
    np.testing.assert_array_equal(session.run({"X": np.array([2.0], np.float32)})["Y"], [3.0])
    assert session.pid not in (None, first_pid)
    assert session.restarts == 1


def test_loading_leaves_sys_modules_and_path_clean(repo_dir: Path) -> None:
    assert pb_utils.MODULE_ALIAS not in sys.modules
    assert str(repo_dir / "add_sub" / "1") not in sys.path


def _write_model(root: Path, name: str, code: str, config: str | None) -> tuple[Any, Path]:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(code)
    if config is not None:
        (root / name / "config.pbtxt").write_text(config)
    repo = ModelRepository(root)
    return repo.config(name), repo.model_file(name, 1)


@pytest.mark.parametrize("isolation", ["in_process", "process"])
def test_undeclared_tensors_and_broken_models_are_config_errors(tmp_path: Path, isolation: str) -> None:
    params = f'parameters {{ key: "isolation" value: {{ string_value: "{isolation}" }} }}\n'
    cfg, path = _write_model(
        tmp_path,
        "bare",
        "class TritonPythonModel:\n    def execute(self, r):\n        return []\n",
        'backend: "python"\n' + params,
    )
    with pytest.raises(ModelConfigError, match="must declare its inputs and outputs"):
        load_session(cfg, path, threads=1)
    cfg, path = _write_model(tmp_path, "noclass", "x = 1\n", 'backend: "python"\n' + params)
    with pytest.raises(ModelConfigError, match="TritonPythonModel"):
        load_session(cfg, path, threads=1)
    cfg, path = _write_model(
        tmp_path,
        "badinit",
        "import triton_python_backend_utils as pb_utils\n"
        "class TritonPythonModel:\n    def initialize(self, args):\n"
        "        raise pb_utils.TritonModelException('no weights')\n"
        "    def execute(self, r):\n        return []\n",
        XY_CONFIG + params,
    )
    with pytest.raises(ModelConfigError, match="initialize failed.*no weights"):
        load_session(cfg, path, threads=1)


def test_unknown_isolation_value_lists_the_accepted(tmp_path: Path) -> None:
    cfg, path = _write_model(
        tmp_path, "m", IDENTITY, XY_CONFIG + 'parameters { key: "isolation" value: { string_value: "thread" } }\n'
    )
    with pytest.raises(ModelConfigError, match="in_process, process"):
        load_session(cfg, path, threads=1)


def test_finalize_runs_on_close(tmp_path: Path) -> None:
    marker = tmp_path / "finalized"
    code = IDENTITY + f"\n    def finalize(self):\n        open({str(marker)!r}, 'w').write('done')\n"
    for isolation in ("in_process", "process"):
        cfg, path = _write_model(
            tmp_path / isolation,
            "m",
            code,
            XY_CONFIG + f'parameters {{ key: "isolation" value: {{ string_value: "{isolation}" }} }}\n',
        )
        session = load_session(cfg, path, threads=1)
        session.close()
        session.close()  # idempotent
        assert marker.read_text() == "done"
        marker.unlink()
        with pytest.raises(InferenceError, match="closed"):
            session.run({"X": np.zeros(1, np.float32)})


@pytest.mark.parametrize("isolation", ["in_process", "process"])
def test_through_the_inference_service(repo_dir: Path, isolation: str) -> None:
    import json

    from frameserve.service import InferenceService

    override = {"parameters": {"isolation": isolation}}
    with InferenceService(ModelRepository(repo_dir), threads=1) as service:
        for name in ("add_sub", "add_onnx", "bls", "bls_async", "checked_sqrt", "auto_complete"):
            service.load(name, config_override=override if name != "add_onnx" else None)
        out = service.infer("bls", {"MODEL_NAME": np.array([b"add_sub"], dtype=object), "INPUT0": A, "INPUT1": B})
        np.testing.assert_array_equal(out["OUTPUT0"], A + B)
        out = service.infer(
            "bls", {"MODEL_NAME": np.array([b"add_onnx"], dtype=object), "INPUT0": A, "INPUT1": B}, outputs=["OUTPUT1"]
        )
        assert list(out) == ["OUTPUT1"]
        np.testing.assert_array_equal(out["OUTPUT1"], A - B)
        np.testing.assert_array_equal(service.infer("bls_async", {"INPUT0": A, "INPUT1": B})["OUTPUT1"], B - A)
        futures = [
            service.submit(InferRequest("checked_sqrt", {"X": np.array([[v]], np.float32)})) for v in (4.0, -1.0, 9.0)
        ]
        assert futures[0].result()["Y"][0, 0] == 2.0
        with pytest.raises(InvalidInputError, match="negative"):
            futures[1].result()
        assert futures[2].result()["Y"][0, 0] == 3.0
        info = service.infer(
            "auto_complete", {"IN": np.array([[1, 2, 3]], np.int32)}, request_id="abc", parameters={"k": "v"}
        )["INFO"]
        sent = json.loads(info[0, 0])
        assert sent["request_id"] == "abc" and sent["parameters"] == {"k": "v"}
        assert service.model_config("auto_complete").max_batch_size == 4
        assert service.session_info("add_sub")["isolation"] == isolation


def test_every_shared_memory_block_is_unlinked(repo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import types
    from multiprocessing import shared_memory

    from frameserve.backends.python import _shm_tensors

    seen: set[str] = set()

    class Recording(shared_memory.SharedMemory):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            seen.add(self.name)

    monkeypatch.setattr(_shm_tensors, "shared_memory", types.SimpleNamespace(SharedMemory=Recording))
    srv = Server(repo_dir, "process")
    try:
        srv.sessions["bls"].run({"MODEL_NAME": np.array([b"add_sub"], dtype=object), "INPUT0": A, "INPUT1": B})
        srv.sessions["bls_async"].run({"INPUT0": A, "INPUT1": B})
        srv.sessions["checked_sqrt"].run_requests(
            [  # type: ignore[attr-defined]
                {"X": np.ones((1, 3), np.float32)},
                {"X": -np.ones((1, 3), np.float32)},
            ]
        )
        with pytest.raises(InferenceError):
            srv.sessions["crasher"].run({"X": np.array([13.0], np.float32)})
    finally:
        srv.close()
    assert len(seen) >= 8  # inputs, outputs and BLS blocks, created here or opened from workers
    assert [n for n in seen if Path("/dev/shm", n.lstrip("/")).exists()] == []


@pytest.mark.parametrize(
    "tensors",
    [
        {
            "f": np.arange(6, dtype=np.float32).reshape(2, 3),
            "b": np.array([True, False]),
            "u": np.arange(3, dtype=np.uint64),
        },
        {"empty": np.zeros((0, 4), np.float32), "s": np.array([[b"a", b""], [b"\xff", b"xyz"]], dtype=object)},
        {"strided": np.arange(20, dtype=np.int16).reshape(4, 5)[:, ::2], "h": np.ones((2, 2), np.float16)},
    ],
)
def test_pack_and_unpack_round_trip(tensors: dict[str, np.ndarray[Any, Any]]) -> None:
    from frameserve.backends.python.process import pack_tensors, unpack_tensors

    block, descs = pack_tensors(tensors)
    assert block is not None
    try:
        assert all(d[4] % 64 == 0 for d in descs)  # aligned offsets
        back = unpack_tensors(block, descs, copy=True)
    finally:
        block.close()
        block.unlink()
    assert list(back) == list(tensors)
    for name, want in tensors.items():
        got = back[name]
        assert got.shape == want.shape and got.dtype == (object if want.dtype.kind == "O" else want.dtype)
        assert got.tolist() == want.tolist()
