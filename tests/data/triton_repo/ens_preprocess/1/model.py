"""PIXELS = mean of each pair of RAW_IMAGE values / 255 * SCALE (batched rows)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "RAW_IMAGE").as_numpy()
            scale = pb_utils.get_input_tensor_by_name(request, "SCALE").as_numpy()
            pairs = raw.astype(np.float32).reshape(raw.shape[0], 4, 2)
            pixels = (pairs[:, :, 0] + pairs[:, :, 1]) / np.float32(2 * 255) * scale
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PIXELS", pixels.astype(np.float32))]))
        return responses
