"""``frameserve tune``, ``plan`` and ``quantize`` as a user runs them: tune on a tiny model with
a budget of seconds writes exactly its four outputs, the tuned folder serves unchanged under
``frameserve serve`` and answers as the model does, the report renders in headless chromium,
plan reads the result, Ctrl-C (SIGINT) keeps what was measured, and quantize writes an int8
nudenet that passes the gate or refuses (exit 2) one that does not."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import yaml
from _browser import chromium, open_in_browser
from _models import conv_model
from _plan_bound import plan_bound
from _serving import ServeProcess, frameserve_command

from frameserve.tuning._search import TRIAL_FIELDS

pytestmark = pytest.mark.e2e

SHAPE = ["--shape", "images:3x16x16"]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory, cli) -> tuple[Path, Path, Any]:  # type: ignore[no-untyped-def]
    """``frameserve tune conv --time-budget 6s --out DIR``: (model folder, DIR, tune.json)."""
    root = tmp_path_factory.mktemp("tune")
    conv_model(root / "conv" / "1" / "model.onnx")
    out = root / "out"
    proc = cli(
        "tune", str(root / "conv"), "--time-budget", "6s", *SHAPE, "--p99-ms", "500", "--out", str(out), timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"report: {out / 'report.html'}" in proc.stdout and "tuned / default throughput:" in proc.stdout
    assert "int8 not tried: no --calibration" in proc.stdout
    return root / "conv", out, json.loads((out / "tune.json").read_text())


def test_tune_writes_exactly_the_four_outputs(tuned: tuple[Path, Path, Any]) -> None:
    _, out, data = tuned
    assert sorted(p.name for p in out.iterdir()) == ["conv", "report.html", "trials.csv", "tune.json"]
    assert sorted(p.name for p in (out / "conv").iterdir()) == ["1", "config.yaml"]
    with (out / "trials.csv").open() as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == TRIAL_FIELDS
        rows = list(reader)
    assert len(rows) == len(data["trials"]) >= 4 and rows[0]["phase"] == "default"
    assert all(float(r["throughput"]) > 0 and float(r["p50_ms"]) <= float(r["p99_ms"]) for r in rows if r["throughput"])
    assert data["objective"] == {
        "kind": "throughput",
        "p99_ms": 500.0,
        "min_throughput": None,
        "text": "throughput with p99 <= 500 ms",
    }
    assert data["machine"]["cpu_budget"] >= 1 and data["space"]["size"] <= 150
    assert data["search"]["trials"] == len(rows) and data["search"]["method"] == "coordinate"
    assert all(r["instances"] * r["threads"] <= data["machine"]["cpu_budget"] for r in data["trials"])
    winner = data["winner"]
    config = yaml.safe_load((out / "conv" / "config.yaml").read_text())
    assert config == winner["config_yaml"] and config["version_policy"] == {"specific": {"versions": [1]}}
    assert config["input"] == [{"name": "images", "data_type": "TYPE_FP32", "dims": [3, 16, 16]}]  # --shape fixed it
    assert "ratio_best_over_default" in data["comparison"]
    # the leaders and the default chose the winner served over HTTP by a serve child, as users get them
    assert data["finalists"] == "served"
    repeats = [r for r in data["trials"] if r["phase"] == "repeat"]
    assert repeats and all(r["status"] == "measured" for r in repeats), repeats
    assert data["comparison"]["default"]["source"] == "repeats"


def test_the_tuned_folder_serves_unchanged_and_answers_as_the_model(
    tuned: tuple[Path, Path, Any], tmp_path: Path
) -> None:
    import tritonclient.http as httpclient

    src, out, data = tuned
    x = np.random.default_rng(5).random((1, 3, 16, 16), dtype=np.float32)
    want = ort.InferenceSession(str(src / "1" / "model.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"images": x}
    )[0]
    with ServeProcess(out, tmp_path / "home", "--no-jobs") as srv:
        srv.wait_ready()
        client = httpclient.InferenceServerClient(f"127.0.0.1:{srv.ports['HTTP']}")
        item = httpclient.InferInput("images", [1, 3, 16, 16], "FP32")
        item.set_data_from_numpy(x, binary_data=True)
        got = client.infer("conv", [item]).as_numpy("features")
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        served = client.get_model_config("conv")
        winner = data["winner"]
        assert served["backend"] == winner["backend"]
        assert served["instance_group"][0]["count"] == winner["instances"]
        # the parameters written are served (the default, when it wins, is written as the model's own config)
        written = {k: str(v) for k, v in (winner["config_yaml"].get("parameters") or {}).items() if k != "precision"}
        assert written.items() <= {k: v["string_value"] for k, v in (served.get("parameters") or {}).items()}.items()
        assert written.get("threads", str(winner["threads"])) == str(winner["threads"])
        assert (winner["config"] == data["search"]["baseline"]) == ("threads" not in written), (winner, data["search"])
        assert ("dynamic_batching" in served) == bool(winner["dynamic_batching"])
        client.close()
        assert srv.stop() == 0


def test_the_tune_report_renders_in_a_headless_browser(tuned: tuple[Path, Path, Any], tmp_path: Path) -> None:
    browser = chromium()
    _, out, data = tuned
    seen = open_in_browser(browser, out / "report.html", tmp_path)
    assert seen["errors"] == []
    assert seen["images"] == 4 and seen["decoded"] == 4, seen  # default vs best, trials, progress, repeats
    tables = {t["cls"]: t for t in seen["tables"]}
    assert {"summary", "side-by-side", "top", "finalists", "gates", "space", "machine", "trials"} <= set(tables)
    assert tables["trials"]["rows"] == len(data["trials"])
    assert all(t["height"] > 0 for t in seen["tables"])


def test_plan_from_the_tune_result(tuned: tuple[Path, Path, Any], cli) -> None:  # type: ignore[no-untyped-def]
    _, out, data = tuned
    bound = f"{plan_bound(out / 'tune.json'):g}"  # from what the tune measured: not the machine's load
    proc = cli(
        "plan", "--tune", str(out), "--qps", "100000", "--p99-ms", bound, "--video-hours", "5", "--json", timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    p = json.loads(proc.stdout)
    node = p["online"]["node"]
    assert node["cpus"] == data["machine"]["cpu_budget"] and node["p99_ms"] <= float(bound)
    assert p["online"]["nodes"] == int(np.ceil(100000 * 1.3 / node["throughput"]))
    assert p["video"]["frames_per_s_per_core"] > 0 and p["video"]["nodes"] >= 1
    text = cli("plan", "--tune", str(out), "--qps", "10", "--p99-ms", bound, timeout=60)
    assert text.returncode == 0 and "online server:" in text.stdout
    bad = cli("plan", "--tune", str(out), "--qps", "10", "--p99-ms", "0.0001", timeout=60)
    assert bad.returncode == 2 and "no measured configuration meets p99" in bad.stderr


PIPELINE = """
import cv2
import numpy as np

from frameserve import Pipeline


class Tiny(Pipeline):
    name = "tiny"
    models = {"m": "conv"}
    batch = 4

    def preprocess(self, frame):
        small = cv2.resize(frame.rgb, (16, 16), interpolation=cv2.INTER_AREA)
        return {"images": np.ascontiguousarray(small.transpose(2, 0, 1), dtype=np.float32) / 255.0}

    def postprocess(self, frame, outputs):
        return {"mean": float(outputs["features"].mean())}
"""


def test_video_cotuning_writes_the_best_decode_settings(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    from _videogen import make_video

    conv_model(tmp_path / "conv" / "1" / "model.onnx")
    (tmp_path / "tiny.py").write_text(PIPELINE)
    video = make_video(tmp_path / "clip.mp4", 24, size=(64, 48)).path
    out = tmp_path / "out"
    proc = cli(
        "tune",
        str(tmp_path / "conv"),
        "--time-budget",
        "4s",
        *SHAPE,
        "--video",
        str(video),
        "--pipeline",
        str(tmp_path / "tiny.py"),
        "--out",
        str(out),
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "video: " in proc.stdout and "frames/s end to end with frameserve run VIDEO" in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == ["conv", "report.html", "trials.csv", "tune.json"]
    v = json.loads((out / "tune.json").read_text())["video"]
    sweep = [r for r in v["trials"] if r["phase"] == "sweep"]
    assert {(r["decode_workers"], r["decode_threads"]) for r in sweep} >= {(0, 1)}
    assert all(r["error"] is None and r["frames"] == 24 for r in v["trials"]), v["trials"]
    best = v["best"]
    assert best["frames_per_s"] > 0 and best["runs"] >= 2 and best["batch"] >= 1
    assert f"--decode-workers {best['decode_workers']} --decode-threads {best['decode_threads']}" in best["command"]
    assert 'class="video"' in (out / "report.html").read_text()


def test_ctrl_c_keeps_what_was_measured(tmp_path: Path, test_home: Path) -> None:
    conv_model(tmp_path / "conv" / "1" / "model.onnx")
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [*frameserve_command(), "tune", str(tmp_path / "conv"), "--time-budget", "120s", *SHAPE, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "FRAMESERVE_HOME": str(test_home)},
        # as a terminal's foreground job: a test run started in the background (`cmd &` in a
        # script) ignores SIGINT, and a child inherits that, so its Ctrl-C would never arrive
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # "searching N configurations ...": trials start now
        assert line.startswith("searching"), line
        while not line.startswith("trial "):  # a trial measured (stderr is no terminal: a line each)
            line = proc.stderr.readline()
            assert line, "tune ended before its first trial"
        proc.send_signal(signal.SIGINT)
        # past the 120 s budget: a Ctrl-C that was lost lets the tune end by itself (exit 0, and
        # the assertions below say so with its stderr) instead of timing out here
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr[-2000:]
    assert "interrupted: kept the" in stderr
    assert sorted(p.name for p in out.iterdir()) == ["conv", "report.html", "trials.csv", "tune.json"]
    data = json.loads((out / "tune.json").read_text())
    assert data["search"]["interrupted"] and data["search"]["stopped_by"] == "interrupted"
    assert 1 <= len(data["trials"]) < 35 and data["winner"] is not None
    assert (out / "conv" / "config.yaml").is_file()


def test_quantize_writes_a_gated_int8_nudenet_or_refuses(tmp_path: Path, cli, real_asset) -> None:  # type: ignore[no-untyped-def]
    model = tmp_path / "nudenet"
    (model / "1").mkdir(parents=True)
    shutil.copy(real_asset("nudenet-320n.onnx"), model / "1" / "model.onnx")
    video = str(real_asset("carphone_pristine.mp4"))
    common = ["quantize", str(model), "--calibration", video, "--pipeline", "nudenet", "--max-frames", "40"]
    ok = cli(*common, "--out", str(tmp_path / "int8"), timeout=300)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "gate on 20 held-apart frames: passed" in ok.stdout
    assert sorted(p.name for p in (tmp_path / "int8").iterdir()) == ["nudenet", "quantize.json"]
    assert sorted(p.name for p in (tmp_path / "int8" / "nudenet").iterdir()) == ["1", "2", "config.yaml"]
    report = json.loads((tmp_path / "int8" / "quantize.json").read_text())
    assert report["passed"] and report["gate"]["matched_share"] >= 0.99 and report["gate"]["mean_box_error_px"] <= 2
    bad = cli(*common, "--engine", "onnxruntime", "--include-head", "--out", str(tmp_path / "naive"), timeout=300)
    assert bad.returncode == 2, bad.stderr[-3000:]
    assert "refused: no model written" in bad.stderr and "gate on 20 held-apart frames: refused" in bad.stdout
    assert sorted(p.name for p in (tmp_path / "naive").iterdir()) == ["quantize.json"]
    assert not json.loads((tmp_path / "naive" / "quantize.json").read_text())["passed"]
