"""Y = sqrt(X) with per-request errors (negative input) and batch errors (NaN input)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if np.isnan(x).any():
                raise pb_utils.TritonModelException("X holds NaN")
            if (x < 0).any():
                error = pb_utils.TritonError("X must not be negative", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.sqrt(x))]))
        return responses
