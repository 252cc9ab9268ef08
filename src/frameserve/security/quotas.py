"""Per-tenant quotas: what one tenant (a token's NAME) may take of a shared server.

The quotas file (``frameserve serve --quotas FILE``, YAML) has a ``default`` row, applied to every
tenant, and per-tenant rows under ``tenants`` that override single fields of it::

    default:
      queued_jobs: 1000          # jobs in state queued (submit over it: 429)
      running_jobs: 4            # jobs running at once (a worker skips the tenant while at it)
      analyze_concurrency: 1     # POST /v1/analyze requests at once
      infer_rate: 200            # v2 inference requests per second (token bucket refill) ...
      infer_burst: 400           # ... and the bucket's size (default: one second of infer_rate)
      infer_concurrency: 32      # v2 inference requests in flight at once
      connections: 64            # HTTP connections open at once (counted once a request names the tenant)
      streams: 8                 # gRPC ModelStreamInfer streams open at once
    tenants:
      batch-team:
        queued_jobs: 100000
        running_jobs: 16
      free-tier:
        infer_rate: 10

Every field is a positive integer or ``null`` (no limit of that kind). A field left out of the
``default`` row takes the built-in default of :class:`TenantQuota` (no limit, but
``queued_jobs``: 10,000, ``connections``: 256 and ``streams``: 16); a field left out of a tenant's row takes the ``default`` row's.
Unknown fields or tenants' rows that are not mappings stop the start with the file's name and
the offending key.

Over a limit, a request is refused with :class:`~frameserve.errors.QuotaExceededError` (HTTP 429
with ``Retry-After``, gRPC ``RESOURCE_EXHAUSTED``), whose message names the tenant, the limit and
its value.

A base layer (it imports only :mod:`frameserve.errors`): the protocol layer, the job API, the
job store's fair claim and ``/v1/analyze`` all read one :class:`Quotas`.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from frameserve.errors import InvalidInputError, QuotaExceededError, retry_after_header

__all__ = [
    "DEFAULT_QUOTA",
    "ConcurrencyGate",
    "InferGate",
    "Quotas",
    "RateGate",
    "TenantQuota",
    "TokenBucket",
    "connection_gate",
    "retry_after_header",
]

_MAX_FILE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class TenantQuota:
    """What one tenant may take; ``None`` in a field means no limit of that kind.

    Attributes:
        queued_jobs: most jobs of the tenant in state ``queued``; a submit over it gets 429.
        running_jobs: most jobs of the tenant running at once (workers skip the tenant's jobs
            while it is at the limit; nothing is refused).
        analyze_concurrency: most ``POST /v1/analyze`` requests of the tenant at once.
        infer_rate: v2 inference requests per second (HTTP and gRPC together), the refill rate
            of a token bucket.
        infer_burst: the bucket's size, in requests (``None``: ``max(1, infer_rate)``, one
            second's worth).
        infer_concurrency: most v2 inference requests of the tenant in flight at once.
        connections: most HTTP connections of the tenant open at once, counted from the first
            request on a connection that names the tenant until the connection closes
            (:mod:`frameserve.protocol.http._wire`); one more gets 429 and is closed. Default
            256: perf_analyzer's and Triton's clients open one connection per concurrent
            request, and a client at this many is far past what one server's cores answer.
        streams: most gRPC ``ModelStreamInfer`` streams of the tenant open at once; one more is
            refused with ``RESOURCE_EXHAUSTED``. Each stream holds one of the gRPC server's
            threads (:data:`~frameserve.protocol.grpc._threaded.DEFAULT_THREADS`, 64) while it
            lasts, so the default 16 leaves three quarters of them to other tenants.
    """

    queued_jobs: int | None = 10_000
    running_jobs: int | None = None
    analyze_concurrency: int | None = None
    infer_rate: int | None = None
    infer_burst: int | None = None
    infer_concurrency: int | None = None
    connections: int | None = 256
    streams: int | None = 16

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"quota {f.name} must be a positive integer or null, got {value!r}")

    @property
    def burst(self) -> int | None:
        """The token bucket's size in requests (``None`` when ``infer_rate`` is unlimited)."""
        if self.infer_rate is None:
            return None
        return self.infer_burst if self.infer_burst is not None else max(1, self.infer_rate)


DEFAULT_QUOTA = TenantQuota()
"""The quota of every tenant when no quotas file is given."""

_FIELDS = frozenset(f.name for f in fields(TenantQuota))


def _row(raw: Any, base: TenantQuota, where: str) -> TenantQuota:
    if raw is None:
        return base
    if not isinstance(raw, Mapping):
        raise InvalidInputError(f"{where} must be a mapping of limits ({', '.join(sorted(_FIELDS))})")
    unknown = sorted(str(k) for k in raw if k not in _FIELDS)
    if unknown:
        raise InvalidInputError(f"{where}: unknown limit {unknown[0]!r}; accepted: {', '.join(sorted(_FIELDS))}")
    try:
        return replace(base, **{str(k): v for k, v in raw.items()})
    except ValueError as exc:
        raise InvalidInputError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class Quotas:
    """The quota of every tenant: a default row and per-tenant rows.

    Attributes:
        default: the row of a tenant with no row of its own.
        tenants: per-tenant rows, by tenant name (a token's NAME).
    """

    default: TenantQuota = DEFAULT_QUOTA
    tenants: Mapping[str, TenantQuota] = field(default_factory=dict)

    def for_tenant(self, tenant: str) -> TenantQuota:
        """The quota of ``tenant`` (its own row, else the default row)."""
        return self.tenants.get(tenant, self.default)

    def share(self, n: int) -> Quotas:
        """The part of these quotas one of ``n`` processes enforces on its own (``serve
        --http-workers N`` front ends each count the requests they receive): ``infer_rate``,
        ``infer_burst``, ``infer_concurrency``, ``connections`` and ``streams`` divided by ``n``, rounded up;
        the job limits (counted in the database) unchanged."""
        if n <= 1:
            return self

        def part(q: TenantQuota) -> TenantQuota:
            def div(v: int | None) -> int | None:
                return None if v is None else max(1, math.ceil(v / n))

            return replace(
                q,
                infer_rate=div(q.infer_rate),
                infer_burst=div(q.infer_burst),
                infer_concurrency=div(q.infer_concurrency),
                connections=div(q.connections),
                streams=div(q.streams),
            )

        return Quotas(default=part(self.default), tenants={t: part(q) for t, q in self.tenants.items()})

    @property
    def limits_inference(self) -> bool:
        """Whether any row limits ``infer_rate``, ``infer_concurrency`` or ``streams``."""
        return self.limits_requests or any(q.streams is not None for q in (self.default, *self.tenants.values()))

    @property
    def limits_requests(self) -> bool:
        """Whether any row limits ``infer_rate`` or ``infer_concurrency`` (what each inference
        request is checked against; ``streams`` alone is checked once per stream)."""
        return any(
            q.infer_rate is not None or q.infer_concurrency is not None for q in (self.default, *self.tenants.values())
        )

    @classmethod
    def from_mapping(cls, raw: Any, *, where: str = "quotas") -> Quotas:
        """Build from the quotas file's parsed YAML (see the module docstring).

        Raises:
            InvalidInputError: not a mapping, an unknown key or limit, a value that is not a
                positive integer or null; the message names the key.
        """
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise InvalidInputError(f"{where} must be a mapping with 'default' and 'tenants'")
        unknown = sorted(str(k) for k in raw if k not in ("default", "tenants"))
        if unknown:
            raise InvalidInputError(f"{where}: unknown key {unknown[0]!r}; accepted: default, tenants")
        default = _row(raw.get("default"), DEFAULT_QUOTA, f"{where}: default")
        tenants_raw = raw.get("tenants") or {}
        if not isinstance(tenants_raw, Mapping):
            raise InvalidInputError(f"{where}: tenants must be a mapping from tenant name to limits")
        tenants = {str(name): _row(row, default, f"{where}: tenants.{name}") for name, row in tenants_raw.items()}
        return cls(default=default, tenants=tenants)

    @classmethod
    def load(cls, path: str | Path) -> Quotas:
        """Read a quotas file (YAML, at most 1 MiB).

        Raises:
            InvalidInputError: unreadable, too large, not YAML, or not a valid quotas document.
        """
        import yaml

        p = Path(path)
        try:
            size = p.stat().st_size
            if size > _MAX_FILE_BYTES:
                raise InvalidInputError(f"quotas file {p} is {size} bytes; at most {_MAX_FILE_BYTES} are read")
            raw = yaml.safe_load(p.read_text(encoding="utf-8"))
        except OSError as exc:
            raise InvalidInputError(f"cannot read quotas file {p}: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise InvalidInputError(f"quotas file {p} is not valid YAML: {exc}") from None
        return cls.from_mapping(raw, where=f"quotas file {p}")


class TokenBucket:
    """A token bucket (rate ``rate_per_s`` tokens a second, at most ``burst`` held), thread-safe.

    The classic shaping algorithm (e.g. RFC 2697's single-rate meter, without colours): a request
    takes one token; with none left it is refused and told how long until one is there.

    Args:
        rate_per_s: refill rate, tokens per second (> 0).
        burst: bucket size in tokens (>= 1); the bucket starts full.
        clock: monotonic seconds (injected for tests).
    """

    def __init__(self, rate_per_s: float, burst: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError(f"rate_per_s must be > 0 and burst >= 1, got {rate_per_s!r}, {burst!r}")
        self.rate_per_s = float(rate_per_s)
        self.burst = int(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self._lock = threading.Lock()

    def take(self) -> float:
        """Take one token: 0.0 when taken, else the seconds until one will be there (> 0)."""
        return self._wait(take=True)

    def wait_s(self) -> float:
        """What :meth:`take` would answer, without taking: 0.0 when a token is there, else the
        seconds until one will be."""
        return self._wait(take=False)

    def _wait(self, *, take: bool) -> float:
        with self._lock:
            now = self._clock()
            tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate_per_s)
            ready = tokens >= 1.0 - 1e-9  # float sums of refills land a hair under a whole token
            if take:  # the refill is kept, and the token taken when there is one
                self._tokens, self._at = max(0.0, tokens - 1.0) if ready else tokens, now
            return 0.0 if ready else (1.0 - tokens) / self.rate_per_s


class ConcurrencyGate:
    """Per-tenant counters of things held at once (requests in flight, slots).

    Args:
        limit_of: the limit of a tenant (``None``: no limit), e.g.
            ``lambda t: quotas.for_tenant(t).infer_concurrency``.
        what: the limit's name as the quotas file spells it, for the error message.
    """

    def __init__(self, limit_of: Callable[[str], int | None], what: str) -> None:
        self._limit_of = limit_of
        self.what = what
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def try_acquire(self, tenant: str) -> None:
        """Hold one more for ``tenant``.

        Raises:
            QuotaExceededError: the tenant holds its limit already.
        """
        limit = self._limit_of(tenant)
        if limit is None:  # nothing to keep: no lock, no count (the limits never change)
            return
        with self._lock:
            held = self._held.get(tenant, 0)
            if held >= limit:
                raise QuotaExceededError.of(tenant, self.what, limit, retry_after_s=1.0)
            self._held[tenant] = held + 1

    def release(self, tenant: str) -> None:
        """Give one back (a release without an acquire is ignored)."""
        if self._limit_of(tenant) is None:
            return
        with self._lock:
            held = self._held.get(tenant, 0) - 1
            if held > 0:
                self._held[tenant] = held
            else:
                self._held.pop(tenant, None)

    def held(self, tenant: str) -> int:
        """How many ``tenant`` holds now (0 for a tenant without a limit: not counted)."""
        with self._lock:
            return self._held.get(tenant, 0)

    def refusal(self, tenant: str) -> QuotaExceededError | None:
        """What :meth:`try_acquire` would raise now (``None``: it would admit), acquiring nothing."""
        limit = self._limit_of(tenant)
        if limit is None or self.held(tenant) < limit:
            return None
        return QuotaExceededError.of(tenant, self.what, limit, retry_after_s=1.0)

    @contextmanager
    def hold(self, tenant: str) -> Iterator[None]:
        """``try_acquire`` on entry, ``release`` on exit."""
        self.try_acquire(tenant)
        try:
            yield
        finally:
            self.release(tenant)


class RateGate:
    """One :class:`TokenBucket` per tenant, made on the tenant's first request from its quota.

    Args:
        quotas: the server's quotas (``infer_rate`` and ``burst`` of each tenant).
        clock: monotonic seconds (injected for tests).
    """

    def __init__(self, quotas: Quotas, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._quotas = quotas
        self._clock = clock
        self._buckets: dict[str, TokenBucket | None] = {}
        self._lock = threading.Lock()

    def take(self, tenant: str) -> None:
        """Take one request's token for ``tenant``.

        Raises:
            QuotaExceededError: the tenant's bucket is empty (``limit`` ``infer_rate``, with the
                seconds until the next token as ``retry_after_s``).
        """
        error = self._answer(tenant, take=True)
        if error is not None:
            raise error

    def refusal(self, tenant: str) -> QuotaExceededError | None:
        """What :meth:`take` would raise now (``None``: a token is there), taking nothing."""
        return self._answer(tenant, take=False)

    def _answer(self, tenant: str, *, take: bool) -> QuotaExceededError | None:
        bucket = self._bucket(tenant)
        if bucket is None:  # no infer_rate for this tenant
            return None
        wait_s = bucket.take() if take else bucket.wait_s()
        if wait_s <= 0.0:
            return None
        return QuotaExceededError.of(tenant, "infer_rate", int(bucket.rate_per_s), retry_after_s=wait_s)

    def _bucket(self, tenant: str) -> TokenBucket | None:
        bucket: TokenBucket | None | bool = self._buckets.get(tenant, False)
        if bucket is False:
            with self._lock:
                bucket = self._buckets.get(tenant, False)
                if bucket is False:
                    quota = self._quotas.for_tenant(tenant)
                    bucket = (
                        None
                        if quota.infer_rate is None
                        else TokenBucket(quota.infer_rate, quota.burst or 1, clock=self._clock)
                    )
                    self._buckets[tenant] = bucket
        return bucket if isinstance(bucket, TokenBucket) else None


def connection_gate(quotas: Quotas) -> ConcurrencyGate | None:
    """The counter of each tenant's open HTTP connections (the ``connections`` quota), or
    ``None`` when no row limits them."""
    if all(q.connections is None for q in (quotas.default, *quotas.tenants.values())):
        return None
    return ConcurrencyGate(lambda t: quotas.for_tenant(t).connections, "connections")


class InferGate:
    """The per-tenant inference limits (``infer_rate`` with ``infer_burst``,
    ``infer_concurrency``, and gRPC ``streams``), checked by the transports on a request's
    headers, before its body is read or decoded.

    Args:
        quotas: the quotas this process enforces (a front end's :meth:`Quotas.share`).
        clock: monotonic seconds (injected for tests).
    """

    def __init__(self, quotas: Quotas, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits_requests = quotas.limits_requests
        """Whether :meth:`enter` can refuse anything (some row limits ``infer_rate`` or
        ``infer_concurrency``); false with the built-in defaults, which limit only ``streams``."""
        self._rate = RateGate(quotas, clock=clock)
        self._inflight = ConcurrencyGate(lambda t: quotas.for_tenant(t).infer_concurrency, "infer_concurrency")
        self._streams = ConcurrencyGate(lambda t: quotas.for_tenant(t).streams, "streams")

    @classmethod
    def of(cls, quotas: Quotas | None, *, share: int = 1) -> InferGate | None:
        """The gate of ``quotas`` (``share``: :meth:`Quotas.share`), or ``None`` when nothing
        limits inference (the transports then skip the check)."""
        if quotas is None or not quotas.limits_inference:
            return None
        return cls(quotas.share(share))

    @staticmethod
    def per_request(gate: InferGate | None) -> InferGate | None:
        """``gate`` where its :meth:`enter` can refuse a request, else ``None``: what the
        transports check each inference request against (the built-in quotas limit only
        ``streams``, so without a quotas file no request pays for an enter and a leave)."""
        return gate if gate is not None and gate.limits_requests else None

    def enter(self, tenant: str) -> None:
        """Admit one request of ``tenant``; :meth:`leave` when it is answered.

        Raises:
            QuotaExceededError: over ``infer_rate`` (``retry_after_s``: until the next token) or
                at ``infer_concurrency``.
        """
        self._rate.take(tenant)
        self._inflight.try_acquire(tenant)

    def refusal(self, tenant: str) -> QuotaExceededError | None:
        """What :meth:`enter` would raise now, taking and holding nothing (``None``: it would
        admit): for a transport that can refuse on a request's headers (gRPC metadata) before
        it reads the request at all; the request admitted so still goes through :meth:`enter`
        (a race with the tenant's other requests only means a later refusal)."""
        return self._rate.refusal(tenant) or self._inflight.refusal(tenant)

    def leave(self, tenant: str) -> None:
        """A request :meth:`enter` admitted is answered."""
        self._inflight.release(tenant)

    def stream(self, tenant: str) -> AbstractContextManager[None]:
        """Holds one of ``tenant``'s ``streams`` while a gRPC stream is open.

        Raises:
            QuotaExceededError: the tenant has its ``streams`` open already.
        """
        return self._streams.hold(tenant)

    @contextmanager
    def held(self, tenant: str) -> Iterator[None]:
        """:meth:`enter` on entry (raising as it does), :meth:`leave` on exit."""
        self.enter(tenant)
        try:
            yield
        finally:
            self.leave(tenant)
