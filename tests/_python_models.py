"""Python (Triton ``model.py``) model sources that several tests serve."""

from __future__ import annotations

RUNNING_SUM = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            total = pb_utils.get_input_tensor_by_name(r, "STATE_IN").as_numpy() + pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", total), pb_utils.Tensor("STATE_OUT", total)]))
        return out
"""
"""A sequence model: OUTPUT = STATE_OUT = STATE_IN + INPUT (INT32), the running sum of its
sequence, kept by the server as Triton's implicit state (``sequence_batching.state`` with
``STATE_IN`` / ``STATE_OUT``)."""
