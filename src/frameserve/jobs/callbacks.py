"""Job callbacks in the Standard Webhooks format, delivered from the store's outbox.

Each finished job with a ``callback_url`` has one outbox row, written in the same transaction as
its final state. The :class:`CallbackDeliverer` claims due rows (with a lease, so a deliverer that
dies mid-callback is replaced) and POSTs the stored body with the headers

- ``webhook-id``: the row's id, the same on every attempt (receivers deduplicate on it),
- ``webhook-timestamp``: the attempt's time, integer seconds since the epoch,
- ``webhook-signature``: ``v1,<base64 HMAC-SHA256 of "id.timestamp.body">`` with the
  ``whsec_`` secret (the ``standardwebhooks`` package signs).

2xx marks the row delivered; 410 Gone stops for good; anything else is retried on the store's
schedule (seconds to hours). Callback URLs resolving to private, loopback, link-local or other
non-public addresses are refused unless allowed, by the address guard job sources use
(:mod:`frameserve.security.guard`): checked at submit, again before each attempt, and at connect,
where the connection goes to the address just checked (no DNS rebinding). Redirects are not
followed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from frameserve.errors import AddressRefusedError, InvalidInputError
from frameserve.jobs._metrics import JobMetrics
from frameserve.jobs._wake import idle_wait
from frameserve.jobs.store import Delivery, JobStore
from frameserve.security import AddressGuard, GuardedTransport, quiet_http_logs, redact_text, redact_uri

__all__ = ["CallbackDeliverer", "check_callback_url", "sign_headers"]

log = logging.getLogger("frameserve.jobs.callbacks")


def _guard(allow_private: bool) -> AddressGuard:
    return AddressGuard(allow_private=allow_private, what="callback_url", flag="--callbacks-allow-private")


def check_callback_url(url: str, *, allow_private: bool) -> None:
    """Refuse a callback URL that is not ``http(s)://host...``, whose host does not resolve, or
    (unless ``allow_private``) that resolves to any non-public address
    (:func:`~frameserve.security.guard.address_refusal`).

    Raises:
        AddressRefusedError: (an :class:`InvalidInputError`) with the reason.
    """
    _guard(allow_private).check_url(url, redact_uri(url))


def sign_headers(secret: str | None, msg_id: str, payload: str, now_s: float) -> dict[str, str]:
    """The Standard Webhooks headers for one attempt (no signature when no secret is set)."""
    ts = int(now_s)
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(ts), "content-type": "application/json"}
    if secret:
        from standardwebhooks import Webhook

        headers["webhook-signature"] = Webhook(secret).sign(msg_id, datetime.fromtimestamp(ts, UTC), payload)
    return headers


class CallbackDeliverer:
    """Delivers due callbacks from the outbox.

    Args:
        store: the job store.
        secret: the ``whsec_...`` signing secret, or ``None`` to send unsigned.
        allow_private: allow private and loopback receivers.
        timeout_s: per-request timeout, seconds.
        lease_s: how long a claimed delivery is ours before another deliverer may retry it.
        poll_s: idle wait between outbox polls, seconds, when no listener of the store's
            :class:`~frameserve.jobs._wake.Signal` hears other processes (else it waits for a
            wake-up, the next due attempt, or the safety poll).
        metrics: where to count attempts (``frameserve_jobs_callback_deliveries_total``), or ``None``.

    Raises:
        InvalidInputError: a malformed ``secret``.
    """

    fault: Callable[[str], None] | None = None
    """The crash tests' hook, called with ``"mid_callback"`` after a receiver answered and before
    the answer is recorded: set after construction, only when ``FRAMESERVE_JOBS_FAULT`` is set
    (:mod:`frameserve.jobs._faults`)."""

    def __init__(
        self,
        store: JobStore,
        *,
        secret: str | None,
        allow_private: bool = False,
        timeout_s: float = 10.0,
        lease_s: float = 30.0,
        poll_s: float = 0.5,
        metrics: JobMetrics | None = None,
    ) -> None:
        import httpx

        if secret:
            from standardwebhooks import Webhook

            try:
                Webhook(secret)  # fail now on a malformed secret
            except Exception as exc:  # binascii.Error, EmptyWebhookSecretError, ...
                raise InvalidInputError(f"webhook secret must be 'whsec_' + base64 of the key: {exc}") from None
        self.store = store
        self.secret = secret
        self.allow_private = allow_private
        self.lease_s = max(lease_s, timeout_s * 2)
        self.poll_s = poll_s
        self.metrics = metrics
        quiet_http_logs()
        self.client = httpx.Client(
            timeout=timeout_s,
            follow_redirects=False,
            trust_env=False,
            transport=GuardedTransport(_guard(allow_private)),
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def deliver_once(self) -> str | None:
        """Claim and attempt one due delivery; returns its new state, or ``None`` when none is due."""
        d = self.store.claim_delivery(lease_s=self.lease_s)
        if d is None:
            return None
        return self._attempt(d)

    def _attempt(self, d: Delivery) -> str:
        import httpx

        try:
            check_callback_url(d.url, allow_private=self.allow_private)
        except InvalidInputError as exc:
            return self._record(d, None, str(exc), permanent=True)
        headers = sign_headers(self.secret, d.id, d.payload, self.store.clock())
        try:
            resp = self.client.post(d.url, content=d.payload.encode(), headers=headers)
            status: int | None = resp.status_code
            error = None if resp.is_success else f"HTTP {resp.status_code}"
        except AddressRefusedError as exc:  # the name now resolves elsewhere than when checked
            return self._record(d, None, str(exc), permanent=True)
        except httpx.HTTPError as exc:
            status, error = None, redact_text(f"{exc.__class__.__name__}: {exc}")
        if self.fault is not None:
            self.fault("mid_callback")
        state = self._record(d, status, error)
        log.info("callback %s for job %s attempt %d: %s (%s)", d.id, d.job_id, d.attempts, state, status or error)
        return state

    def _record(self, d: Delivery, status: int | None, error: str | None, *, permanent: bool = False) -> str:
        state = self.store.delivery_result(d, status=status, error=error, permanent=permanent)
        if self.metrics is not None:
            self.metrics.callback(state)
        return state

    def run(self) -> None:
        """Deliver until :meth:`stop` is called."""
        signal = self.store.signal
        while not self._stop.is_set():
            seen = signal.generation("callback")
            try:
                if self.deliver_once() is None and not self._stop.is_set():
                    idle_wait(
                        signal,
                        "callback",
                        seen,
                        due_at=self.store.next_delivery_due_at(),
                        now=self.store.clock(),
                        poll_s=self.poll_s,
                    )
            except Exception:  # keep delivering; the database may be briefly unavailable
                log.exception("callback deliverer")
                self._stop.wait(self.poll_s)

    def start(self) -> None:
        """Run in a daemon thread."""
        self._thread = threading.Thread(target=self.run, name="frameserve-callbacks", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop after the attempt in flight, and close the HTTP client."""
        self._stop.set()
        self.store.signal.notify("callback")  # end an idle wait now
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.client.close()
