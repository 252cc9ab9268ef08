"""A sequence accumulator (Triton's documented sequence model, written for the Python backend).

Each request of a sequence adds its INPUT to the sequence's running sum; OUTPUT is the sum after
it. The sequence is told by the CORRID control input when the configuration has one, else by
``request.correlation_id()``. START resets the sum; END forgets it. A request with READY false
(a slot the scheduler filled with nothing) changes nothing. CONTROLS echoes what the sequence
batcher delivered: [START, END, READY] as FP32 (1 = true; -1 = the model has no such control).
"""

import numpy as np
import triton_python_backend_utils as pb_utils


def _flag(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return -1.0
    return float(np.asarray(tensor.as_numpy()).astype(np.float32).reshape(-1)[0])


def _key(request):
    tensor = pb_utils.get_input_tensor_by_name(request, "CORRID")
    if tensor is None:
        return request.correlation_id(), None
    value = np.asarray(tensor.as_numpy())
    item = value.reshape(-1)[0]
    return (item.decode() if isinstance(item, bytes) else int(item)), value


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            start, end, ready = _flag(request, "START"), _flag(request, "END"), _flag(request, "READY")
            key, corrid = _key(request)
            total = np.zeros_like(value)
            if ready != 0.0:
                if start == 1.0 or key not in self.sums:
                    self.sums[key] = np.zeros_like(value)
                self.sums[key] = self.sums[key] + value
                total = self.sums[key]
                if end == 1.0:
                    del self.sums[key]
            outputs = [
                pb_utils.Tensor("OUTPUT", total.astype(np.int32)),
                pb_utils.Tensor("CONTROLS", np.array([[start, end, ready]] * value.shape[0], dtype=np.float32)),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
