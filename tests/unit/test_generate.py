"""The generate extension's JSON mapping (frameserve.protocol.http._generate): a body's keys to
inputs and parameters, with the shapes Triton 2.51 gives them (checked against it: a scalar or a
list is ``[n]``, ``[1, n]`` for a model that batches), and responses to Triton's JSON."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from frameserve.errors import InvalidInputError, TensorError
from frameserve.protocol.http._generate import generate_request, response_json
from frameserve.repository import parse_config
from frameserve.security.limits import DEFAULT_LIMITS, TensorLimits

pytestmark = pytest.mark.unit


def _config(max_batch_size: int = 0) -> Any:
    return parse_config(
        {
            "backend": "python",
            "max_batch_size": max_batch_size,
            "input": [
                {"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]},
                {"name": "N", "data_type": "TYPE_INT32", "dims": [-1]},
                {"name": "X", "data_type": "TYPE_FP16", "dims": [-1]},
                {"name": "FLAG", "data_type": "TYPE_BOOL", "dims": [1]},
            ],
            "output": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [1]}],
        },
        default_name="m",
    )


def test_keys_become_inputs_or_parameters() -> None:
    doc = {
        "text_input": "héllo",
        "N": [1, 2, 3],
        "X": 0.5,
        "FLAG": True,
        "temperature": 0.1,
        "parameters": {"stream": False, "k": "v"},
    }
    request = generate_request(_config(), "m", 2, doc, DEFAULT_LIMITS)
    assert request.model_name == "m" and request.model_version == 2
    assert request.inputs["text_input"].tolist() == ["héllo".encode()] and request.inputs["text_input"].dtype == object
    assert request.inputs["N"].dtype == np.int32 and request.inputs["N"].tolist() == [1, 2, 3]
    assert request.inputs["X"].dtype == np.float16 and request.inputs["X"].shape == (1,)
    assert request.inputs["FLAG"].tolist() == [True]
    assert dict(request.parameters) == {"stream": False, "k": "v", "temperature": 0.1}


def test_a_model_that_batches_gets_a_batch_of_one() -> None:
    request = generate_request(_config(4), "m", None, {"N": [1, 2], "text_input": "a"}, DEFAULT_LIMITS)
    assert request.inputs["N"].shape == (1, 2) and request.inputs["text_input"].shape == (1, 1)


@pytest.mark.parametrize(
    ("doc", "error", "text"),
    [
        ([1], InvalidInputError, "must be a JSON object"),
        ({"N": 1.5}, TensorError, "INT32: give integers"),
        ({"N": True}, TensorError, "INT32: give integers"),
        ({"N": 2**40}, TensorError, "does not fit INT32"),
        ({"N": [[1], [2]]}, TensorError, "flat list"),
        ({"text_input": 5}, TensorError, "BYTES: give a string"),
        ({"FLAG": 1}, TensorError, "BOOL: give true/false"),
        ({"X": "1"}, TensorError, "FP16: give numbers"),
        ({"parameters": [1]}, InvalidInputError, "'parameters' must be an object"),
        ({"parameters": {"a": [1]}}, InvalidInputError, "'parameters' must be an object"),
        ({"other": {"a": 1}}, InvalidInputError, "not an input of model 'm'"),
    ],
)
def test_bad_values_are_refused_with_what_is_accepted(doc: Any, error: type[Exception], text: str) -> None:
    with pytest.raises(error, match=text):
        generate_request(_config(), "m", None, doc, DEFAULT_LIMITS)


def test_counts_are_capped() -> None:
    small = TensorLimits(max_bytes_elements=2, max_parameters=1)
    with pytest.raises(TensorError, match="3 elements, over the limit of 2"):
        generate_request(_config(), "m", None, {"text_input": ["a", "b", "c"]}, small)
    with pytest.raises(TensorError):
        generate_request(_config(), "m", None, {"a": 1, "b": 2}, small)


def test_responses_are_tritons_json() -> None:
    outputs = {
        "text_output": np.array([b"hi!"], dtype=object),
        "SQ": np.array([9], np.int32),
        "V": np.array([[1.5, 2.0]], np.float32),
        "E": np.array([b"a", "b\xe9".encode()], dtype=object),
    }
    text = response_json("m", "1", outputs)
    assert text.startswith(b'{"E":')  # keys sorted, as Triton writes them
    assert orjson.loads(text) == {
        "E": ["a", "bé"],
        "SQ": 9,
        "V": [1.5, 2.0],
        "model_name": "m",
        "model_version": "1",
        "text_output": "hi!",
    }
