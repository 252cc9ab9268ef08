"""The sequence models Triton's client examples call (simple_http_sequence_sync_infer_client.py,
simple_grpc_sequence_stream_infer_client.py and their -d form), for the Python backend, from
their public behaviour: what the examples check.

- simple_sequence (direct; START, READY): OUTPUT = INPUT + 1 on a sequence's first request,
  INPUT after it.
- simple_dyna_sequence (oldest; START, END, READY, CORRID UINT64): the same, and the last
  request of a sequence adds the sequence id.
- simple_string_dyna_sequence (oldest; CORRID TYPE_STRING): a running sum of INPUT (no + 1),
  the last request adding the sequence id read as an integer.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


def _flag(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return tensor is not None and bool(np.asarray(tensor.as_numpy()).reshape(-1)[0])


class TritonPythonModel:
    def initialize(self, args):
        self.name = json.loads(args["model_config"])["name"]
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().astype(np.int64)
            start, end = _flag(request, "START"), _flag(request, "END")
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID")
            cid = 0
            if corrid is not None:
                item = np.asarray(corrid.as_numpy()).reshape(-1)[0]
                cid = int(item.decode() if isinstance(item, bytes) else item)
            if self.name == "simple_string_dyna_sequence":
                key = cid
                out = value + (0 if start else self.sums.get(key, 0))
                self.sums[key] = out
                if end:
                    self.sums.pop(key, None)
            else:
                out = value + 1 if start else value
            if end:
                out = out + cid
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out.astype(np.int32))]))
        return responses
