"""Callbacks: Standard Webhooks headers and signature (checked with the ``standardwebhooks``
package), a webhook-id stable across retries, the retry schedule, 410 stops, private addresses
refused unless allowed. A receiver on loopback answers what each test tells it to."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks import Webhook

from frameserve.errors import InvalidInputError
from frameserve.jobs import JobSpec, JobStore
from frameserve.jobs.callbacks import CallbackDeliverer, check_callback_url

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


class Receiver:
    def __init__(self) -> None:
        self.statuses: list[int] = []
        self.calls: list[tuple[dict[str, str], bytes]] = []
        me = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                me.calls.append((dict(self.headers), self.rfile.read(int(self.headers["content-length"]))))
                self.send_response(me.statuses.pop(0) if me.statuses else 200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/cb"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    s = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}", clock=Clock(), callback_schedule_s=(0.0, 5.0, 300.0, 3600.0))
    yield s
    s.close()


def finished_job(store: JobStore, url: str) -> str:
    job, _ = store.submit(JobSpec(source="file:///v.mp4", target="file:///o", pipeline="nudenet", callback_url=url))
    lease = store.claim("w", lease_s=10)
    assert lease is not None
    store.complete(
        lease,
        {"summary": {"labels": {"FACE_MALE": {"frames": 3}}}, "outputs": {"results.json": "file:///o/results.json"}},
    )
    return job.id


def test_signed_delivery_with_a_stable_webhook_id_across_retries(store: JobStore, receiver: Receiver) -> None:
    jid = finished_job(store, receiver.url)
    receiver.statuses = [503, 500]
    deliverer = CallbackDeliverer(store, secret=SECRET, allow_private=True)
    try:
        assert deliverer.deliver_once() == "pending"
        assert deliverer.deliver_once() is None  # next try in 5 s
        store.clock.t += 5  # type: ignore[attr-defined]
        assert deliverer.deliver_once() == "pending"
        store.clock.t += 300  # type: ignore[attr-defined]
        assert deliverer.deliver_once() == "delivered"
    finally:
        deliverer.stop()
    assert len(receiver.calls) == 3
    ids = {h["webhook-id"] for h, _ in receiver.calls}
    assert len(ids) == 1 and ids.pop().startswith("msg_")
    stamps = [int(h["webhook-timestamp"]) for h, _ in receiver.calls]
    assert stamps == [1_800_000_000, 1_800_000_005, 1_800_000_305]  # the attempt's time, not the job's
    bodies = {b for _, b in receiver.calls}
    assert len(bodies) == 1  # the same body every time
    headers, body = receiver.calls[-1]
    assert headers["webhook-signature"].startswith("v1,")
    wh = Webhook(SECRET)
    # the package refuses timestamps older than 5 minutes, so verify the signature it computes
    at = datetime.fromtimestamp(stamps[-1], UTC)
    assert wh.sign(headers["webhook-id"], at, body.decode()) == headers["webhook-signature"]
    payload = json.loads(body)
    assert payload["type"] == "job.succeeded" and payload["timestamp"].endswith("Z")
    assert payload["data"]["id"] == jid and payload["data"]["result"]["outputs"] == {
        "results.json": "file:///o/results.json"
    }
    cb = store.get(jid).callback
    assert cb is not None and cb["state"] == "delivered" and cb["attempts"] == 3 and cb["last_status"] == 200


def test_signature_verifies_with_the_package_at_real_time(tmp_path: Path, receiver: Receiver) -> None:
    store = JobStore(f"sqlite:///{tmp_path / 'real.db'}")
    finished_job(store, receiver.url)
    d = CallbackDeliverer(store, secret=SECRET, allow_private=True)
    assert d.deliver_once() == "delivered"
    d.stop()
    headers, body = receiver.calls[0]
    assert Webhook(SECRET).verify(body, headers)["type"] == "job.succeeded"
    store.close()


def test_410_stops_and_a_dead_receiver_is_retried_then_given_up(store: JobStore, receiver: Receiver) -> None:
    gone = finished_job(store, receiver.url)
    receiver.statuses = [410]
    d = CallbackDeliverer(store, secret=SECRET, allow_private=True, timeout_s=1.0)
    assert d.deliver_once() == "failed"
    cb = store.get(gone).callback
    assert cb is not None and cb["state"] == "failed" and cb["last_status"] == 410
    from _pg import free_port

    dead = finished_job(store, f"http://127.0.0.1:{free_port()}/nobody")
    states = []
    for _ in range(4):
        states.append(d.deliver_once())
        store.clock.t += 3600  # type: ignore[attr-defined]
    d.stop()
    assert states == ["pending", "pending", "pending", "failed"]
    cb = store.get(dead).callback
    assert cb is not None and cb["state"] == "failed" and cb["attempts"] == 4 and cb["last_status"] is None
    assert "Connect" in cb["last_error"]


def test_private_receivers_refused_unless_allowed(store: JobStore, receiver: Receiver) -> None:
    for url in (
        "http://127.0.0.1:9/x",
        "http://10.1.2.3/x",
        "http://[::1]/x",
        "http://169.254.169.254/latest",
        "http://localhost/x",
        "http://192.168.0.1/x",
    ):
        with pytest.raises(InvalidInputError, match="non-public address"):
            check_callback_url(url, allow_private=False)
        check_callback_url(url, allow_private=True)
    for url in ("ftp://example.com/x", "not a url", "http:///nohost"):
        with pytest.raises(InvalidInputError, match="must be an http"):
            check_callback_url(url, allow_private=True)
    check_callback_url("https://8.8.8.8/hook", allow_private=False)
    jid = finished_job(store, receiver.url)
    d = CallbackDeliverer(store, secret=SECRET, allow_private=False)
    assert d.deliver_once() == "failed"  # checked again at delivery: nothing was sent
    d.stop()
    assert receiver.calls == []
    cb: Any = store.get(jid).callback
    assert "non-public" in cb["last_error"]
