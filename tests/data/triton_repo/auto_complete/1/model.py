"""No config file: inputs, outputs and batching come from auto_complete_config (the form of
Triton's python_backend README). OUT = IN * 2 (INT32 [3]); the model folder and request
parameters are echoed for tests."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        config = auto_complete_model_config.as_dict()
        names = [i["name"] for i in config["input"]]
        if "IN" not in names:
            auto_complete_model_config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [3]})
        auto_complete_model_config.add_output({"name": "OUT", "data_type": "TYPE_INT32", "dims": [3]})
        auto_complete_model_config.add_output({"name": "INFO", "data_type": "TYPE_STRING", "dims": [1]})
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def initialize(self, args):
        self.args = dict(args)

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            info = {
                "model_dir": pb_utils.get_model_dir(),
                "parameters": json.loads(request.parameters()),
                "request_id": request.request_id(),
                "requested": request.requested_output_names(),
                "args": {k: v for k, v in self.args.items() if k != "model_config"},
            }
            text = np.array([[json.dumps(info).encode()]] * x.shape[0], dtype=object)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", (x * 2).astype(np.int32)), pb_utils.Tensor("INFO", text)]
                )
            )
        return responses
