"""``frameserve jobs watch ID``: a job's progress bar from a running server's event stream
(``GET /v1/jobs/{id}/events?follow=true``, Server-Sent Events, :mod:`frameserve.jobs._stream`).

The bar shows frames done / expected, percent, frames per second, phase and state; it is
redrawn in place on a terminal and written one line per update otherwise (a log, a pipe). A
dropped connection is resumed with ``Last-Event-ID`` (the id of the last event seen: nothing is
shown twice, nothing missed) after the stream's ``retry:`` delay, doubling up to 10 s, until
``give_up_s`` seconds pass without a connection. The exit status is 0 when the job succeeded,
1 when it failed or was cancelled, 2 when the server refused (no such job, a bad token) or
could not be reached.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from frameserve._sse import EventReader

__all__ = ["render", "watch"]

_TERMINAL = ("succeeded", "failed", "cancelled")
_WIDTH = 24


def render(view: dict[str, Any]) -> str:
    """One line of the bar from a ``progress`` event's data ``{state, phase, progress,
    frames_done, frames_expected, fps}`` (``progress`` in percent)."""
    pct = float(view.get("progress") or 0.0)
    filled = int(round(_WIDTH * min(100.0, max(0.0, pct)) / 100.0))
    done, expected, fps = view.get("frames_done"), view.get("frames_expected"), view.get("fps")
    frames = f"{done if done is not None else '-'}/{expected if expected is not None else '?'} frames"
    rate = f"{fps:.1f} fps" if isinstance(fps, (int, float)) else "- fps"
    return (
        f"[{'#' * filled}{'.' * (_WIDTH - filled)}] {pct:5.1f}%  {frames}  {rate}  "
        f"{view.get('phase') or '-'}  {view.get('state')}"
    )


def watch(
    url: str,
    job_id: str,
    *,
    token: str | None = None,
    out: TextIO | None = None,
    give_up_s: float = 60.0,
    timeout_s: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Follow job ``job_id`` on the server at ``url`` (``http://host:port``) and draw its bar on
    ``out`` (default stderr); returns the exit status (see the module docstring)."""
    import httpx

    out = out or sys.stderr
    tty = out.isatty()
    headers = {"Accept": "text/event-stream"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    last_id = ""
    state: str | None = None
    delay_s = 1.0
    failing_since: float | None = None
    # the read timeout outlasts the server's 15 s keep-alive, so a silent stream is a dead one
    timeout = httpx.Timeout(timeout_s, read=max(timeout_s, 45.0))
    with httpx.Client(base_url=url.rstrip("/"), timeout=timeout) as client:
        while True:
            if last_id:
                headers["Last-Event-ID"] = last_id
            reader = EventReader()
            try:
                with client.stream("GET", f"/v1/jobs/{job_id}/events", params={"follow": "true"}, headers=headers) as r:
                    if r.status_code != 200:
                        r.read()
                        try:
                            why = r.json().get("error")
                        except ValueError:
                            why = r.text[:200]
                        print(f"error: {r.status_code} {why}", file=out)
                        return 2
                    failing_since, delay_s = None, 1.0
                    for chunk in r.iter_bytes():
                        for ev in reader.feed(chunk):
                            if ev.event == "progress":
                                view = ev.json()
                                state = view.get("state")
                                line = render(view)
                                print(("\r" + line) if tty else line, end="" if tty else "\n", file=out, flush=True)
                            elif ev.event in _TERMINAL:
                                state = ev.event
                        last_id = reader.last_event_id or last_id
                if reader.retry_ms is not None:
                    delay_s = max(0.1, reader.retry_ms / 1000.0)
                if state in _TERMINAL:
                    if tty:
                        print(file=out)
                    print(f"job {job_id} {state}", file=out, flush=True)
                    return 0 if state == "succeeded" else 1
            except httpx.HTTPError as exc:  # dropped or refused: resume after the last event seen
                last_id = reader.last_event_id or last_id
                now = time.monotonic()
                failing_since = failing_since if failing_since is not None else now
                if now - failing_since > give_up_s:
                    print(
                        f"error: the server at {url} cannot be reached ({exc.__class__.__name__}); gave up after "
                        f"{give_up_s:g} s",
                        file=out,
                    )
                    return 2
            sleep(delay_s)
            delay_s = min(10.0, delay_s * 2)
