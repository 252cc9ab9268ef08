"""A real :class:`InferenceService` over a tiny repository of Python models, for the transport
unit tests (the HTTP routes and the gRPC servicer run against it with no socket).

Model ``m`` (versions 1 and 3, both served; ``x`` FP32 ``[-1, -1]`` -> ``y = 2 x``, batching up
to 4): an input holding -1 makes ``execute`` raise ``ZeroDivisionError("division by zero")``
(the whole batch fails); one holding -2 answers that request with ``TritonError("kaboom")``.
Model ``n``: the same code, one version, not loaded at start.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from frameserve.repository import ModelRepository
from frameserve.request import InferRequest
from frameserve.scheduler import Dispatch
from frameserve.service import InferenceService

MODEL_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            if (x == -1).any():
                raise ZeroDivisionError("division by zero")
            if (x == -2).any():
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("kaboom")))
                continue
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", (x * 2).astype(np.float32))]))
        return out
"""

CONFIG = """
backend: "python"
max_batch_size: 4
input [{ name: "x", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "y", data_type: TYPE_FP32, dims: [ -1 ] }]
version_policy: { all { } }
"""


def python_repository(root: Path) -> Path:
    """Write models ``m`` (versions 1, 3) and ``n`` (version 1) under ``root``; returns it."""
    for name, versions in (("m", (1, 3)), ("n", (1,))):
        for v in versions:
            (root / name / str(v)).mkdir(parents=True)
            (root / name / str(v) / "model.py").write_text(MODEL_PY)
        (root / name / "config.pbtxt").write_text(f'name: "{name}"\n' + CONFIG)
    return root


class RecordingService(InferenceService):
    """The real service over :func:`python_repository` with ``m`` loaded; it records the
    requests submitted, and the loads and unloads asked for, and can be told to refuse the
    next submits with an error (``fail_with``) as a full queue would."""

    def __init__(self, root: Path | None = None) -> None:
        if root is None:
            root = Path(tempfile.mkdtemp(prefix="frameserve-pyservice-"))
            weakref.finalize(self, shutil.rmtree, root, True)
        super().__init__(ModelRepository(python_repository(root)), threads=1)
        self.load_models(["m"])
        self.calls: list[tuple[str, Any]] = []
        self.submitted: list[tuple[InferRequest, Dispatch]] = []
        self.fail_with: BaseException | None = None

    @property
    def loaded(self) -> dict[str, list[int]]:
        """Every model of the repository with its loaded versions (``[]``: not loaded)."""
        out: dict[str, list[int]] = {}
        for entry in self.repository_index():
            out.setdefault(entry["name"], [])
            if entry["state"] == "READY":
                out[entry["name"]].append(int(entry["version"]))
        return out

    def _submit(self, request: InferRequest, dispatch: Dispatch) -> Future[dict[str, Any]]:
        """Every request's one way in (``submit``, the clients', the ensembles'): recorded with
        the policy it came under."""
        self.submitted.append((request, dispatch))
        if self.fail_with is not None:
            raise self.fail_with
        return super()._submit(request, dispatch)

    def load(self, name: str, version: int | None = None, **kwargs: Any) -> list[int]:
        self.calls.append(("load", (name, kwargs.get("config_override"))))
        return super().load(name, version, **kwargs)

    def unload(self, name: str) -> None:
        self.calls.append(("unload", name))
        super().unload(name)
