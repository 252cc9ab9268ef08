"""LABEL = the name of the largest logit, MARGIN = largest minus second largest logit."""

import numpy as np
import triton_python_backend_utils as pb_utils

NAMES = np.array([b"cat", b"dog", b"bird"], dtype=object)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            logits = pb_utils.get_input_tensor_by_name(request, "LOGITS").as_numpy()
            order = np.argsort(-logits, axis=1, kind="stable")
            rows = np.arange(logits.shape[0])
            best, second = logits[rows, order[:, 0]], logits[rows, order[:, 1]]
            label = NAMES[order[:, 0]].reshape(-1, 1)
            margin = (best - second).reshape(-1, 1).astype(np.float32)
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("LABEL", label), pb_utils.Tensor("MARGIN", margin)])
            )
        return responses
