"""A user's pipeline file that is wrong fails with one line (exit 2) naming the pipeline, the
hook and what was expected — in both executors — and a resolution change mid-stream re-sizes
the shared buffers instead of failing."""

from __future__ import annotations

from pathlib import Path

import pytest
from _realworld import make_resolution_change
from _videogen import make_video

import frameserve
from frameserve.config import Settings

pytestmark = pytest.mark.e2e

HEAD = "import numpy as np\nimport frameserve\n\nclass P(frameserve.Pipeline):\n    name = 'p'\n    models = {}\n    batch = 2\n"
OK_PRE = "    def preprocess(self, frame):\n        return {'m': np.asarray(frame.rgb.mean(), np.float32)}\n"
OK_PROC = "    def process(self, batch, models):\n        return [{'m': float(i.inputs['m'])} for i in batch]\n"

CASES = {
    "does_not_import": ("import nosuch_module_xyz\n", "does not import: ModuleNotFoundError"),
    "missing_preprocess": (HEAD + OK_PROC, "hook preprocess is missing"),
    "new_keys_later": (
        HEAD + "    def preprocess(self, frame):\n"
        "        out = {'m': np.zeros(1, np.float32)}\n"
        "        if frame.index == 3:\n            out['extra'] = np.zeros(1, np.float32)\n"
        "        return out\n" + OK_PROC.replace("float(i.inputs['m'])", "0.0"),
        "preprocess() on frame 3 returned {m: float32, extra: float32}, but the first frame returned {m: float32}",
    ),
    "new_dtype_later": (
        HEAD + "    def preprocess(self, frame):\n"
        "        return {'m': np.zeros(1, np.float64 if frame.index == 2 else np.float32)}\n"
        + OK_PROC.replace("float(i.inputs['m'])", "0.0"),
        "preprocess() on frame 2 returned {m: float64}",
    ),
    "wrong_count": (
        HEAD + OK_PRE + "    def process(self, batch, models):\n        return [{}]\n",
        "returned 1 results; expected a list of 2",
    ),
    "raises": (
        HEAD + OK_PRE + "    def process(self, batch, models):\n"
        "        if batch[0].frame.index >= 4:\n            raise ValueError('no good')\n        return [{} for _ in batch]\n",
        "process() on frames 4-5 raised ValueError: no good",
    ),
    "reserved_key": (
        HEAD + OK_PRE + "    def process(self, batch, models):\n        return [{'index': 1} for _ in batch]\n",
        "has key(s) ['index']",
    ),
    "unknown_model": (
        HEAD.replace("models = {}", "models = {'det': 'no_such_model'}")
        + OK_PRE
        + "    def postprocess(self, frame, outputs):\n        return {}\n",
        "model role 'det' names 'no_such_model'",
    ),
}


@pytest.mark.parametrize("workers", ["0", "1"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_user_pipeline_exits_2_with_one_line(cli, tmp_path: Path, case: str, workers: str) -> None:  # type: ignore[no-untyped-def]
    made = make_video(tmp_path / "v.mp4", 8, size=(32, 24))
    body, expect = CASES[case]
    (tmp_path / "p.py").write_text(body)
    proc = cli(
        "run",
        str(made.path),
        "--pipeline",
        str(tmp_path / "p.py"),
        "--decode-workers",
        workers,
        "--model-repository",
        str(tmp_path / "models"),
        timeout=120,
    )
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) >= 1 and lines[-1].startswith("error:"), proc.stderr
    assert expect in " ".join(proc.stderr.split()), proc.stderr


def test_a_resolution_change_resizes_the_shared_buffers(tmp_path: Path) -> None:
    video = tmp_path / "sizes.ts"
    sizes = make_resolution_change(video, sizes=((64, 48), (96, 64), (32, 24)), per=4)
    pipe = tmp_path / "shape.py"
    pipe.write_text(
        "import numpy as np\nimport frameserve\n\nclass Shape(frameserve.Pipeline):\n    name = 'shape'\n"
        "    models = {}\n    batch = 3\n    needs_rgb = True\n"
        "    def preprocess(self, frame):\n        return {'small': frame.rgb[::2, ::2].copy()}\n"
        "    def process(self, batch, models):\n"
        "        return [{'shape': list(i.inputs['small'].shape), 'rgb': list(i.frame.rgb.shape),\n"
        "                 'sum': int(i.inputs['small'].sum())} for i in batch]\n"
    )
    settings = Settings(home=tmp_path / "home", model_repository=tmp_path / "none", threads=1)
    runs = [frameserve.run(video, str(pipe), decode_workers=w, settings=settings) for w in (0, 1)]
    assert runs[0]["frames"] == runs[1]["frames"]
    got = [tuple(f["rgb"][:2]) for f in runs[1]["frames"]]
    assert got == [(h, w) for (w, h) in sizes]
    assert [tuple(f["shape"][:2]) for f in runs[1]["frames"]] == [((h + 1) // 2, (w + 1) // 2) for (w, h) in sizes]
