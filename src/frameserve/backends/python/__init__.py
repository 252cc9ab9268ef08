"""The ``python`` backend: a user's ``model.py`` with a class shaped like Triton's
``TritonPythonModel`` (triton-inference-server/python_backend ``README.md``).

Life of a model (what Triton does, and so what an unmodified Triton model expects):

1. ``model.py`` is imported under a unique module name, with its version folder on
   ``sys.path`` only while it imports; ``import triton_python_backend_utils`` gives
   :mod:`frameserve.backends.python.pb_utils` (also :mod:`frameserve.pb_utils`) while the model
   loads and runs.
2. ``TritonPythonModel.auto_complete_config(auto_complete_model_config)`` (optional, static)
   may add inputs, outputs, ``max_batch_size`` and dynamic batching to the config; after it
   the config must declare the inputs and outputs (config.pbtxt / config.yaml or this hook).
3. ``initialize(args)`` (optional) with Triton's string keys: ``model_config`` (the config as
   JSON text), ``model_instance_kind`` (``"CPU"``), ``model_instance_name``,
   ``model_instance_device_id`` (``"0"``), ``model_repository`` (the model's folder),
   ``model_version``, ``model_name``.
4. ``execute(requests) -> responses``: one :class:`~frameserve.pb_utils.InferenceResponse`
   per request, same order. A response with ``error`` fails only its request; an exception
   (or a wrong number of responses) fails the whole batch. ``async def execute`` works too
   (run to completion on a fresh event loop). A decoupled model
   (``model_transaction_policy.decoupled``) answers through each request's response sender
   instead (:mod:`~frameserve.backends.python._pb_sender`), zero or more responses per request,
   and ``execute`` returns ``None``; the responses go to the request's
   :attr:`~frameserve.request.InferRequest.responses` (from a worker process through
   :mod:`~frameserve.backends.python._process_stream`).
5. ``finalize()`` (optional) on :meth:`close`; its errors are logged, not raised.

Where it runs, set by ``parameters.isolation`` in the model's config:

- ``in_process`` (default): in the server's process, on the caller's thread; tensors are
  handed over as they are (no copies). One lock serialises ``execute`` per session
  (:mod:`~frameserve.backends.python.session`).
- ``process``: one worker process per session (instance), started with ``spawn``; tensors
  cross through shared memory, BLS calls come back to the server over the pipe
  (:mod:`~frameserve.backends.python.process`).

Modules: :mod:`~frameserve.backends.python.pb_utils` (Triton's ``triton_python_backend_utils``),
:mod:`~frameserve.backends.python.host` (what both sessions share: loading ``model.py``, calling
its hooks, checking what it returns), ``session`` and ``process``. BLS calls reach the server only
through the ``infer`` of the :class:`~frameserve.backends.BackendContext` given at load time, as
the tenant of the requests they are made for (:mod:`~frameserve.backends.python._bls`); nothing
here imports the service.
"""

from __future__ import annotations

from frameserve.backends.python.host import ISOLATION_MODES, ISOLATION_PARAMETER
from frameserve.backends.python.session import PythonSession, load_python_session

__all__ = ["ISOLATION_MODES", "ISOLATION_PARAMETER", "PythonSession", "load_python_session"]
