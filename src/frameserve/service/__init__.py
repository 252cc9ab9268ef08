"""The transport-neutral inference core: load, unload, readiness, metadata, config, infer,
statistics and metrics.

The HTTP routes, the gRPC servicer, the video pipeline and the job worker all call
:class:`InferenceService`; none of them knows a backend. Each loaded model version has its own
:class:`~frameserve.scheduler.Scheduler` (dynamic batcher + instance pool). Every request is one
:class:`~frameserve.request.InferRequest`: :meth:`InferenceService.submit` (the one way in)
resolves its version, checks it against the model, counts a refusal and queues it there;
:meth:`InferenceService.run` waits for the answer, :meth:`InferenceService.infer` builds the
request from plain arguments first. Where a caller's batches may run (on its own thread when the
model is fast, or always on an instance's thread) is a policy given once:
:meth:`InferenceService.client` returns the :class:`InferClient` a transport holds. The protocol extensions (:data:`EXTENSIONS`) and the failure
metrics of requests a transport refuses (:meth:`InferenceService.record_failure`) live here too.

Modules: ``_loading`` (the table of loaded versions and their lifecycle), ``_service`` (the
service: server state, views and the request path).
"""

from frameserve.service._service import EXTENSIONS, InferClient, InferenceService, failure_reason

__all__ = ["EXTENSIONS", "InferClient", "InferenceService", "failure_reason"]
