"""frameserve.pb_utils: Triton's triton_python_backend_utils surface, as the Python backend README
describes it (Tensor, InferenceRequest/Response, TritonError, BLS exec/async_exec, ModelConfig)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest

from frameserve import pb_utils
from frameserve.errors import InferenceError, InvalidInputError, ModelNotFoundError, ModelNotReadyError, NotFoundError
from frameserve.request import InferRequest


def test_tensor_wraps_the_array_without_copying() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = pb_utils.Tensor("x", a)
    assert t.name() == "x"
    assert t.as_numpy() is a
    assert t.is_cpu()
    assert t.shape() == (2, 3)
    assert t.triton_dtype() == 11  # TYPE_FP32


def test_tensor_rejects_unicode_arrays_and_non_arrays() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="np.object_"):
        pb_utils.Tensor("s", np.array(["a", "b"]))
    with pytest.raises(pb_utils.TritonModelException, match="numpy array"):
        pb_utils.Tensor("l", [1, 2, 3])  # type: ignore[arg-type]


def test_dlpack_round_trip_shares_memory() -> None:
    a = np.arange(8, dtype=np.int64)
    capsule = pb_utils.Tensor("a", a).to_dlpack()
    back = pb_utils.Tensor.from_dlpack("b", capsule)
    assert back.name() == "b"
    assert np.shares_memory(back.as_numpy(), a)
    np.testing.assert_array_equal(back.as_numpy(), a)
    # an object with __dlpack__ (as torch tensors have) works too
    assert np.shares_memory(pb_utils.Tensor.from_dlpack("c", a).as_numpy(), a)


def test_dlpack_of_read_only_array_is_a_copy_and_bytes_refused() -> None:
    ro = np.frombuffer(np.arange(4, dtype=np.float32).tobytes(), dtype=np.float32)
    assert not ro.flags.writeable
    back = np.from_dlpack(pb_utils.Tensor.from_dlpack("r", pb_utils.Tensor("r", ro).to_dlpack()).as_numpy())
    np.testing.assert_array_equal(back, ro)
    assert not np.shares_memory(back, ro)
    with pytest.raises(pb_utils.TritonModelException, match="BYTES"):
        pb_utils.Tensor("b", np.array([b"x"], dtype=object)).to_dlpack()
    with pytest.raises(pb_utils.TritonModelException, match="C-contiguous"):
        pb_utils.Tensor.from_dlpack("t", np.arange(12, dtype=np.float32).reshape(3, 4).T)


@pytest.mark.parametrize(
    ("name", "dtype"),
    [("TYPE_FP32", np.float32), ("TYPE_STRING", np.object_), ("TYPE_BOOL", np.bool_), ("TYPE_UINT64", np.uint64)],
)
def test_triton_string_to_numpy(name: str, dtype: type) -> None:
    assert pb_utils.triton_string_to_numpy(name) is dtype
    number = pb_utils.numpy_to_triton_type(dtype)
    assert pb_utils.triton_to_numpy_type(number) is dtype  # type: ignore[arg-type]


def test_triton_string_to_numpy_unknown_lists_accepted() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="TYPE_FP32"):
        pb_utils.triton_string_to_numpy("FP32")


def test_bytes_serialization_round_trip_and_truncation() -> None:
    a = np.array([[b"ab", b""], [b"\x00\xff", "caf\u00e9"]], dtype=object)
    flat = pb_utils.serialize_byte_tensor(a)
    assert flat is not None and flat.dtype == np.uint8
    assert bytes(flat[:6]) == b"\x02\x00\x00\x00ab"
    back = pb_utils.deserialize_bytes_tensor(flat.tobytes())
    assert list(back) == [b"ab", b"", b"\x00\xff", "caf\u00e9".encode()]
    with pytest.raises(pb_utils.TritonModelException, match="runs past"):
        pb_utils.deserialize_bytes_tensor(b"\x05\x00\x00\x00ab")


def test_triton_error_codes_and_exception() -> None:
    e = pb_utils.TritonError("nope")
    assert e.message() == "nope" and e.code() == pb_utils.TritonError.INTERNAL
    assert pb_utils.TritonError("x", pb_utils.TritonError.NOT_FOUND).code() == 2
    codes = [
        getattr(pb_utils.TritonError, n)
        for n in (
            "UNKNOWN",
            "INTERNAL",
            "NOT_FOUND",
            "INVALID_ARG",
            "UNAVAILABLE",
            "UNSUPPORTED",
            "ALREADY_EXISTS",
            "CANCELLED",
        )
    ]
    assert codes == list(range(8))
    exc = pb_utils.TritonModelException("bad")
    assert exc.message() == "bad" and str(exc) == "bad"


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (pb_utils.TritonError.INVALID_ARG, InvalidInputError),
        (pb_utils.TritonError.NOT_FOUND, NotFoundError),
        (pb_utils.TritonError.UNAVAILABLE, ModelNotReadyError),
        (pb_utils.TritonError.INTERNAL, InferenceError),
        (pb_utils.TritonError.UNKNOWN, InferenceError),
    ],
)
def test_response_error_maps_to_frameserve_error(code: int, cls: type) -> None:
    err = pb_utils.to_frameserve_error(pb_utils.TritonError("why", code), "model 'm'")
    assert type(err) is cls
    assert str(err) == "model 'm': why"


def test_response_accessors() -> None:
    t0, t1 = pb_utils.Tensor("A", np.zeros(2)), pb_utils.Tensor("B", np.ones(2))
    r = pb_utils.InferenceResponse(output_tensors=[t0, t1])
    assert r.output_tensors() == [t0, t1] and not r.has_error() and r.error() is None
    assert pb_utils.get_output_tensor_by_name(r, "B") is t1
    assert pb_utils.get_output_tensor_by_name(r, "C") is None
    err = pb_utils.InferenceResponse(error=pb_utils.TritonError("bad"))
    assert err.has_error() and err.error().message() == "bad"  # type: ignore[union-attr]
    with pytest.raises(pb_utils.TritonModelException, match="list"):
        pb_utils.InferenceResponse(output_tensors=t0)  # type: ignore[arg-type]
    with pytest.raises(pb_utils.TritonModelException, match="Tensor"):
        pb_utils.InferenceResponse(output_tensors=[np.zeros(2)])  # type: ignore[list-item]


def test_request_accessors() -> None:
    x = pb_utils.Tensor("X", np.zeros(3))
    req = pb_utils.InferenceRequest(
        model_name="m", inputs=[x], requested_output_names=["Y"], request_id="r1", parameters={"k": 1, "s": "v"}
    )
    assert req.inputs() == [x]
    assert req.requested_output_names() == ["Y"]
    assert req.request_id() == "r1"
    assert json.loads(req.parameters()) == {"k": 1, "s": "v"}
    assert pb_utils.get_input_tensor_by_name(req, "X") is x
    assert pb_utils.get_input_tensor_by_name(req, "Z") is None
    assert not req.is_cancelled()
    with pytest.raises(pb_utils.TritonModelException, match="only on the requests execute receives"):
        req.get_response_sender()


class _Recorder:
    def __init__(self, result: dict[str, np.ndarray[Any, Any]] | None = None, error: Exception | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.result = result or {}
        self.error = error

    def __call__(self, request: InferRequest) -> dict[str, np.ndarray[Any, Any]]:
        """The ``infer`` a server injects: one frameserve InferRequest per BLS call."""
        names = request.output_names
        self.calls.append(
            (request.model_name, dict(request.inputs), request.model_version, None if names is None else list(names))
        )
        if self.error is not None:
            raise self.error
        return self.result


def test_bls_exec_calls_infer_with_the_request() -> None:
    a = np.arange(4, dtype=np.float32)
    rec = _Recorder({"OUT": a * 2})
    req = pb_utils.InferenceRequest(
        model_name=b"other", inputs=[pb_utils.Tensor("IN", a)], requested_output_names=["OUT"]
    )
    with pb_utils.bound(rec, "/models/m/1"):
        resp = req.exec()
        versioned = pb_utils.InferenceRequest(
            model_name="other", inputs=[pb_utils.Tensor("IN", a)], requested_output_names=[], model_version=3
        ).exec(decoupled=True)
    assert not resp.has_error()
    np.testing.assert_array_equal(pb_utils.get_output_tensor_by_name(resp, "OUT").as_numpy(), a * 2)  # type: ignore[union-attr]
    assert rec.calls[0][0] == "other" and rec.calls[0][2] is None and rec.calls[0][3] == ["OUT"]
    assert rec.calls[0][1]["IN"] is a  # no copy on the way
    (only,) = list(versioned)
    assert not only.has_error()
    assert rec.calls[1][2] == 3 and rec.calls[1][3] is None


def test_bls_failures_come_back_as_error_responses() -> None:
    req = pb_utils.InferenceRequest(model_name="missing", inputs=[], requested_output_names=["Y"])
    with pb_utils.bound(_Recorder(error=ModelNotFoundError("no model 'missing'")), "/m"):
        resp = req.exec()
    assert resp.has_error()
    assert resp.error().code() == pb_utils.TritonError.NOT_FOUND  # type: ignore[union-attr]
    assert "no model 'missing'" in resp.error().message()  # type: ignore[union-attr]
    outside = req.exec()  # no server bound: a clear error, not an exception
    assert outside.has_error() and "BLS" in outside.error().message()  # type: ignore[union-attr]
    assert outside.error().code() == pb_utils.TritonError.UNAVAILABLE  # type: ignore[union-attr]


def test_bls_async_exec_runs_concurrently_awaitable() -> None:
    rec = _Recorder({"Y": np.ones(1)})

    async def model_execute() -> list[pb_utils.InferenceResponse]:
        awaits = [
            pb_utils.InferenceRequest(model_name=f"m{i}", inputs=[], requested_output_names=["Y"]).async_exec()
            for i in range(3)
        ]
        return list(await asyncio.gather(*awaits))

    with pb_utils.bound(rec, "/m"):
        responses = asyncio.run(model_execute())
    assert [r.has_error() for r in responses] == [False] * 3
    assert sorted(c[0] for c in rec.calls) == ["m0", "m1", "m2"]


def test_get_model_dir_only_while_bound() -> None:
    with pb_utils.bound(None, "/repo/m/1"):
        assert pb_utils.get_model_dir() == "/repo/m/1"
    with pytest.raises(pb_utils.TritonModelException, match="while a Python model runs"):
        pb_utils.get_model_dir()


def test_model_config_auto_complete_helpers() -> None:
    base = {"name": "m", "max_batch_size": 0, "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [4]}]}
    mc = pb_utils.ModelConfig(base)
    view = mc.as_dict()
    view["input"].clear()
    assert len(mc.as_dict()["input"]) == 1  # as_dict is a copy
    mc.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [4]})  # same spec: no change
    mc.add_input({"name": "B", "data_type": "TYPE_INT32", "dims": [-1], "optional": True})
    mc.add_output({"name": "C", "data_type": "TYPE_FP32", "dims": [4]})
    with pytest.raises(ValueError, match="dims"):
        mc.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [5]})
    with pytest.raises(ValueError, match="data_type"):
        mc.add_output({"name": "C", "data_type": "TYPE_FP16", "dims": [4]})
    with pytest.raises(ValueError, match="missing"):
        mc.add_output({"name": "D"})
    mc.set_max_batch_size(8)
    with pytest.raises(ValueError, match="max_batch_size 8"):
        mc.set_max_batch_size(4)
    mc.set_dynamic_batching()
    d = mc.as_dict()
    assert [i["name"] for i in d["input"]] == ["A", "B"]
    assert [o["name"] for o in d["output"]] == ["C"]
    assert d["max_batch_size"] == 8 and d["dynamic_batching"] == {}
    assert pb_utils.get_input_config_by_name(d, "B")["data_type"] == "TYPE_INT32"  # type: ignore[index]
    assert pb_utils.get_output_config_by_name(d, "Z") is None


def test_all_is_sorted_and_complete() -> None:
    assert pb_utils.__all__ == sorted(pb_utils.__all__)
    for name in pb_utils.__all__:
        assert hasattr(pb_utils, name), name
