"""Asynchronous BLS in the form of Triton's python_backend examples/bls async model."""

import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            swapped = [pb_utils.Tensor("INPUT0", in_1.as_numpy()), pb_utils.Tensor("INPUT1", in_0.as_numpy())]
            awaits = [
                pb_utils.InferenceRequest(
                    model_name="add_sub", requested_output_names=["OUTPUT0"], inputs=[in_0, in_1]
                ).async_exec(),
                pb_utils.InferenceRequest(
                    model_name="add_sub", requested_output_names=["OUTPUT1"], inputs=swapped
                ).async_exec(),
            ]
            first, second = await asyncio.gather(*awaits)
            for response in (first, second):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
            out_0 = pb_utils.get_output_tensor_by_name(first, "OUTPUT0")
            out_1 = pb_utils.get_output_tensor_by_name(second, "OUTPUT1")
            responses.append(pb_utils.InferenceResponse([out_0, out_1]))
        return responses
