"""Fault points for the crash tests (``tests/e2e/test_jobs_crash.py``, ``test_jobs_chaos.py``): a
hook that pauses a worker process at a named point so a test can SIGKILL or SIGSTOP it exactly
there.

Not part of any constructor: the processes that run jobs (``frameserve worker``,
:class:`~frameserve.jobs.embedded.EmbeddedJobs`) read :func:`faults_from_env` once and set the
``fault`` attribute of their :class:`~frameserve.jobs.worker.Worker` and
:class:`~frameserve.jobs.callbacks.CallbackDeliverer` (and hand it to the pipeline step) only when
``FRAMESERVE_JOBS_FAULT`` is set. The points: ``mid_download``, ``mid_inference``,
``after_upload`` (the worker), ``mid_callback`` (the deliverer).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from frameserve.jobs._pipeline import FaultHook

__all__ = ["FaultHook", "faults_from_env"]


def faults_from_env(environ: Mapping[str, str] | None = None) -> FaultHook | None:
    """Fault injection for crash tests, or ``None`` when unset.

    ``FRAMESERVE_JOBS_FAULT`` names the points (comma-separated) and ``FRAMESERVE_JOBS_FAULT_DIR``
    a folder. The first time the process reaches such a point it writes ``<dir>/<point>.<pid>``
    and waits until ``<dir>/release`` exists, so a test can SIGKILL or SIGSTOP it exactly there.
    """
    env = os.environ if environ is None else environ
    points = {p.strip() for p in env.get("FRAMESERVE_JOBS_FAULT", "").split(",") if p.strip()}
    if not points:
        return None
    folder = Path(env.get("FRAMESERVE_JOBS_FAULT_DIR", tempfile.gettempdir()))
    hit: set[str] = set()
    lock = threading.Lock()

    def fault(point: str) -> None:
        with lock:
            if point not in points or point in hit:
                return
            hit.add(point)
        (folder / f"{point}.{os.getpid()}").write_text(str(time.time()))
        deadline = time.monotonic() + float(env.get("FRAMESERVE_JOBS_FAULT_MAX_WAIT_S", "600"))
        while not (folder / "release").exists():
            if time.monotonic() > deadline:  # never outlive a test run that forgot us
                os._exit(3)
            time.sleep(0.02)

    return fault
