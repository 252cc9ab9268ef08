"""The response cache's bound, keys and eligibility, and classification's text form."""

from __future__ import annotations

import numpy as np
import pytest

from frameserve.errors import InvalidInputError, ModelConfigError
from frameserve.request import InferRequest, RequestedOutput
from frameserve.scheduler import ResponseCache, parse_cache_config
from frameserve.scheduler._classify import check_classification, classify
from frameserve.types import DataType

pytestmark = pytest.mark.unit


def _req(x: np.ndarray, **kw: object) -> InferRequest:
    return InferRequest(model_name="m", inputs={"x": x}, **kw)  # type: ignore[arg-type]


def test_cache_config_parses_triton_form() -> None:
    assert parse_cache_config("local,size=1048576") == 1048576
    for bad in ("redis,size=1", "local,size=-1", "local,size=x", "local", "local,cap=3"):
        with pytest.raises(ModelConfigError):
            parse_cache_config(bad)


def test_key_covers_bytes_shape_dtype_outputs_and_parameters() -> None:
    x = np.arange(4, dtype=np.float32)
    base = ResponseCache.key(_req(x), 1)
    assert base is not None and len(base) == 32 and ResponseCache.key(_req(x.copy()), 1) == base
    variants = [
        _req(np.array([0, 1, 2, 4], np.float32)),
        _req(x.reshape(2, 2)),
        _req(x.view(np.int32)),
        _req(x, outputs=(RequestedOutput("y", None, {"classification": 2}),)),
        _req(x, parameters={"k": 1}),
        _req(x, tenant="bob"),  # one tenant never hits what another's request left (a timing side channel)
    ]
    keys = {ResponseCache.key(r, 1) for r in variants} | {ResponseCache.key(_req(x), 2)}
    assert base not in keys and len(keys) == 7
    assert ResponseCache.key(_req(x, tenant="bob"), 1) == ResponseCache.key(_req(x.copy(), tenant="bob"), 1)


def test_bytes_inputs_and_sequences_are_not_cached() -> None:
    assert ResponseCache.key(_req(np.array([b"a"], dtype=object)), 1) is None
    assert ResponseCache.key(_req(np.zeros(2, np.float32), parameters={"sequence_id": 7}), 1) is None


def test_lru_stays_within_its_size() -> None:
    cache = ResponseCache(3 * 4096)
    for i in range(10):
        assert cache.insert(bytes([i]) * 32, {"y": np.zeros(512, np.float64)})  # 4 KiB each
        assert cache.used_bytes <= cache.size_bytes
    assert len(cache) == 2 and cache.evictions == 8
    assert cache.lookup(bytes([9]) * 32) is not None and cache.lookup(bytes([0]) * 32) is None
    assert not cache.insert(b"big" * 11, {"y": np.zeros(10_000, np.float64)})  # larger than the cache
    held = cache.lookup(bytes([9]) * 32)
    assert held is not None and not held["y"].flags.writeable


def test_classification_form_as_triton() -> None:
    scores = np.array([[0.25, 0.75, 0.5], [3.0, 1.0, 2.0]], dtype=np.float32)
    out = classify(scores, 2, ["a", "b"], batching=True)
    assert out.tolist() == [[b"0.750000:1:b", b"0.500000:2"], [b"3.000000:0:a", b"2.000000:2"]]
    assert classify(np.array([1, 9, 4], np.int32), 5, (), batching=False).tolist() == [b"9:1", b"4:2", b"1:0"]
    with pytest.raises(InvalidInputError, match="unsupported type 'FP16'"):
        check_classification("y", DataType.FP16, 1)
    with pytest.raises(InvalidInputError):
        check_classification("y", DataType.FP32, -1)
