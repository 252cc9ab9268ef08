"""What happens to one model version's requests around its scheduler: Triton's classification
extension (:mod:`frameserve.scheduler._classify`) and the response cache
(:mod:`frameserve.scheduler._cache`). The service runs every request through
:meth:`ResponsePath.submit`; a request that asks for neither costs one dict lookup.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from pathlib import Path

from frameserve.errors import FrameserveError, InferenceError, ModelConfigError
from frameserve.metrics import Metrics
from frameserve.repository import ModelConfig
from frameserve.request import InferRequest
from frameserve.scheduler._cache import ResponseCache
from frameserve.scheduler._classify import check_classification, classify_outputs, read_labels
from frameserve.scheduler._request import Outputs
from frameserve.scheduler._stats import ModelStats

__all__ = ["ResponsePath"]

log = logging.getLogger(__name__)


def _done(result: Outputs) -> Future[Outputs]:
    future: Future[Outputs] = Future()
    future.set_result(result)
    return future


class ResponsePath:
    """Classification and response caching for one loaded model version.

    Args:
        config: the version's completed config.
        version: its version number.
        labels: output name -> its labels (from its ``label_filename``).
        cache: the server's response cache; used only when ``config.response_cache`` is set.
        stats: the version's statistics (cache hits and misses are counted there).
        metrics: where ``nv_cache_*`` and the successes of cache hits are counted.
        now_ns: a monotonic clock in nanoseconds.
    """

    def __init__(
        self,
        config: ModelConfig,
        version: int,
        *,
        labels: Mapping[str, Sequence[str]],
        cache: ResponseCache | None,
        stats: ModelStats,
        metrics: Metrics,
        now_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.config = config
        self.version = version
        self.labels = dict(labels)
        self.cache = cache if config.response_cache else None
        self.stats = stats
        self.metrics = metrics
        self._now_ns = now_ns
        self._batching = bool(config.max_batch_size)

    @classmethod
    def open(
        cls,
        config: ModelConfig,
        version: int,
        stats: ModelStats,
        model_dir: Path | None,
        *,
        cache: ResponseCache | None,
        metrics: Metrics,
    ) -> ResponsePath:
        """The path of a version being loaded: its labels read from ``model_dir`` (the model's
        folder) for each ``label_filename``.

        Raises:
            ModelConfigError: a label file that cannot be read, or labels without a folder.
        """
        labels = {}
        for output, filename in config.label_filenames.items():
            where = f"model {config.name!r} output {output!r}"
            if model_dir is None:
                raise ModelConfigError(f"{where}: label_filename needs the model's folder")
            labels[output] = read_labels(model_dir / filename, where)
        return cls(config, version, labels=labels, cache=cache, stats=stats, metrics=metrics)

    def check(self, request: InferRequest) -> None:
        """Refuse a request's bad ``classification`` parameters before it is queued.

        Raises:
            InvalidInputError: a class count that is not an integer >= 0, or one asked of an
                output whose datatype cannot be classified.
        """
        for out in request.outputs:
            if "classification" in out.parameters:
                check_classification(out.name, self.config.output(out.name).datatype, out.parameters["classification"])

    def active(self, request: InferRequest) -> bool:
        """Whether :meth:`submit` has anything to do for ``request`` (the model caches its
        responses, or the request asks for classification); when not, its caller may enqueue
        it on the scheduler itself (one call and one ``functools.partial`` fewer per request)."""
        if self.cache is not None:
            return True
        for o in request.outputs:  # most outputs have no parameters: no generator, no lookup
            if o.parameters and o.parameters.get("classification"):
                return True
        return False

    def submit(
        self,
        requests: Sequence[tuple[InferRequest, int]],
        enqueue: Callable[[Sequence[tuple[InferRequest, int]]], list[Future[Outputs]]],
    ) -> list[Future[Outputs]]:
        """Answer requests ``(request, batch size)`` (checked already) that arrived together:
        from the cache on a hit, else through ``enqueue`` (the scheduler's, the misses in one
        call), classifying and caching their results on the way back; one future per request,
        in order.

        Raises:
            Whatever ``enqueue`` raises (nothing is cached then).
        """
        for request, _ in requests:
            if self.active(request):
                break
        else:
            return enqueue(requests)
        plans = [self._lookup(r) for r, _ in requests]
        misses = [i for i, p in enumerate(plans) if p[2] is None]
        futures = enqueue([requests[i] for i in misses]) if misses else []
        out: list[Future[Outputs] | None] = [p[2] for p in plans]
        for i, future in zip(misses, futures, strict=True):
            out[i] = self._wrap(future, requests[i][0], plans[i])
        return [f for f in out if f is not None]

    def _lookup(self, request: InferRequest) -> tuple[bytes | None, int, Future[Outputs] | None]:
        """``(cache key or None, lookup ns, the answer on a hit or None)``."""
        if self.cache is None:
            return None, 0, None
        start = self._now_ns()
        key = self.cache.key(request, self.version)
        if key is not None:
            hit = self.cache.lookup(key)
            if hit is not None:
                ns = self._now_ns() - start
                self.stats.record_cache_hit(request_ns=ns, cache_ns=ns)
                self.metrics.record_cache(self.config.name, self.version, hit=True, cache_ns=ns, request_ns=ns)
                return key, ns, _done(hit)
        return key, self._now_ns() - start, None

    def _wrap(
        self, future: Future[Outputs], request: InferRequest, plan: tuple[bytes | None, int, Future[Outputs] | None]
    ) -> Future[Outputs]:
        """A future of ``future``'s result classified and cached as ``request`` asks."""
        key, lookup_ns, _ = plan
        counts = {
            o.name: int(o.parameters["classification"]) for o in request.outputs if o.parameters.get("classification")
        }
        if not counts and key is None:
            return future
        answer: Future[Outputs] = Future()

        def finish(done: Future[Outputs]) -> None:
            try:
                _finish(done)
            except InvalidStateError:  # cancelled by the caller meanwhile
                pass

        def _finish(done: Future[Outputs]) -> None:
            exc = done.exception()
            if exc is not None:
                answer.set_exception(exc)
                return
            try:
                result = done.result()
                if counts:
                    result = classify_outputs(result, counts, self.labels, batching=self._batching)
                if key is not None and self.cache is not None:
                    start = self._now_ns()
                    self.cache.insert(key, result)
                    ns = lookup_ns + self._now_ns() - start
                    self.stats.record_cache_miss(cache_ns=ns)
                    self.metrics.record_cache(self.config.name, self.version, hit=False, cache_ns=ns)
            except FrameserveError as error:
                answer.set_exception(error)
                return
            except Exception as error:  # never lose the caller's answer
                log.exception("model %r: classifying or caching a result failed", self.config.name)
                answer.set_exception(InferenceError(f"model {self.config.name!r}: {type(error).__name__}: {error}"))
                return
            answer.set_result(result)

        future.add_done_callback(finish)
        return answer
