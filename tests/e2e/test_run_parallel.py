"""`frameserve run` with the parallel runner: the same results as one process, the timing
profile and trace, and Ctrl-C leaving no process or shared memory behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _videogen import make_video  # noqa: E402
from _wait import wait_for, wait_value


def test_cli_single_and_parallel_give_the_same_frames(cli, carphone, nudenet_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    results = {}
    for workers in ("0", "1"):
        out, trace = tmp_path / f"r{workers}.json", tmp_path / f"t{workers}.json"
        proc = cli("run", str(carphone), "--decode-workers", workers, "--out", str(out), "--trace", str(trace))
        assert proc.returncode == 0, proc.stderr
        assert "bottleneck: " in proc.stdout and "wait s" in proc.stdout
        results[workers] = json.loads(out.read_text())
        events = json.loads(trace.read_text())["traceEvents"]
        assert {e["name"] for e in events if e["ph"] == "X"} >= {"decode", "preprocess", "infer", "postprocess"}
    assert results["1"]["frames"] == results["0"]["frames"]
    assert results["1"]["summary"] == results["0"]["summary"]
    assert results["0"]["decode_workers"] == 0 and results["1"]["decode_workers"] == 1
    assert "sequential" in results["0"]["bottleneck"]["line"]
    assert "-bound: " in results["1"]["bottleneck"]["line"]


def _decode_children(pid: int) -> list[psutil.Process]:
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for k in kids:
        try:
            if "spawn_main" in " ".join(k.cmdline()):
                out.append(k)
        except psutil.NoSuchProcess:
            pass
    return out


def test_ctrl_c_exits_130_and_leaves_nothing(test_home, nudenet_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # long enough (~8 s at ~70 frames/s on a quiet 2-core machine) that the run cannot end
    # between the check below and the signal
    vid = make_video(tmp_path / "v.mp4", 512, size=(320, 240)).path
    exe = Path(sys.executable).with_name("frameserve")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "frameserve"]
    env = {**os.environ, "FRAMESERVE_HOME": str(test_home)}
    proc = subprocess.Popen(
        [*cmd, "run", str(vid), "--batch", "1", "--decode-workers", "1", "--out", str(tmp_path / "r.json")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        # as from an interactive shell: a shell without job control starts background jobs with
        # SIGINT ignored, which the child inherits (and rightly keeps), so pytest run that way
        # would never see the interrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        children = wait_value(
            lambda: _decode_children(proc.pid) if proc.poll() is None else ["exited"],
            bool,
            120,
            "the decode process to start",
            every_s=0.2,
        )
        assert children != ["exited"], "the run ended before its decode process started"

        def frames_flowing() -> bool:  # the streamed results file has records
            return proc.poll() is not None or any(p.stat().st_size > 0 for p in tmp_path.glob(".r.json*"))

        wait_for(frames_flowing, 120, "results to stream to the partial file", every_s=0.05)
        assert proc.poll() is None, "finished before it could be interrupted"
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr

    def gone(child: psutil.Process) -> bool:
        try:
            return not psutil.pid_exists(child.pid) or child.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(lambda: all(gone(c) for c in children), 10, "the decode processes to end")
    assert not list(Path("/dev/shm").glob(f"frameserve-{proc.pid}-*"))
    assert not (tmp_path / "r.json").exists() and not list(tmp_path.glob(".r.json*"))


@pytest.mark.parametrize("workers", ["0", "1"])
def test_bad_video_exits_2_in_both_modes(cli, tmp_path, workers: str) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "notes.mp4"
    bad.write_text("this is not a video\n" * 50)
    proc = cli("run", str(bad), "--decode-workers", workers)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "notes.mp4" in proc.stderr
