"""Finding pipelines: built-in names, YAML declarations of a built-in class, user Python files,
and the one-line errors for each way a pipeline can be wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from frameserve.errors import PipelineHookError, PipelineNotFoundError, PipelineSpecError
from frameserve.pipeline.builtin.detect import Detector
from frameserve.pipeline.loader import builtin_pipelines, instantiate, load_pipeline, merge_params, parse_param


def test_builtin_nudenet_reproduces_package_settings() -> None:
    assert "nudenet" in builtin_pipelines()
    cls = load_pipeline("nudenet").load_class()
    assert issubclass(cls, Detector) and cls.models == {"det": "nudenet"}
    p = instantiate(cls)
    assert p.spec.size == (320, 320)
    assert (p.spec.resize, p.spec.anchor, p.spec.pad_value) == ("pad_square", "top_left", 0)
    assert p.spec.interpolation == "linear"
    assert p.decoder.score_threshold == 0.25 and p.decoder.iou_threshold == 0.45
    assert p.decoder.class_agnostic is True
    assert len(p.decoder.labels) == 18 and p.decoder.labels[1] == "FACE_FEMALE"
    assert cls.model_config["det"]["max_batch_size"] == 16 and p.params["aggregate"]["segment_gap_s"] == 1.0


def test_unknown_pipeline_lists_builtins_and_forms() -> None:
    with pytest.raises(PipelineNotFoundError) as exc:
        load_pipeline("nosuch")
    assert "nudenet" in str(exc.value) and ".yaml" in str(exc.value) and ".py" in str(exc.value)
    with pytest.raises(PipelineNotFoundError, match="not found"):
        load_pipeline("/no/such/file.py")


def test_yaml_first_form_and_param_overrides(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(
        "name: mine\nmodel: m\nbatch: 2\npreprocess: {size: [64, 32]}\n"
        "postprocess: {type: yolov8, labels: [a, b]}\naggregate: {segment_gap_s: 0.5}\n"
    )
    cls = load_pipeline(p).load_class()
    assert cls.name == "mine" and cls.batch == 2 and cls.models == {"det": "m"}
    inst = instantiate(cls, params={"postprocess.score_threshold": 0.4})
    assert inst.spec.size == (64, 32) and inst.decoder.score_threshold == 0.4
    assert inst.params["aggregate"]["segment_gap_s"] == 0.5


@pytest.mark.parametrize(
    "text,match",
    [
        ("name: x\nmodel: m\npostprocess: {type: yolov8, labels: [a]}\nsampler: all\n", "unknown key"),
        ("model: m\npostprocess: {type: yolov8, labels: [a]}\n", "missing required key 'name'"),
        ("name: x\nmodel: m\npostprocess: {type: ssd}\n", "accepted: yolov8"),
        ("name: x\nmodel: m\npostprocess: {labels: [a]}\nbatch: 0\n", "batch must be an int >= 1"),
        ("name: x\nmodel: m\npostprocess: {labels: [a]}\npreprocess: {resize: zoom}\n", "accepted: letterbox"),
        ("type: nosuch\nname: x\n", "type 'nosuch' is not a built-in pipeline class"),
        (
            "type: detector\nname: x\nparams: {nosuch: 1}\n",
            "unknown param 'nosuch'; accepted: aggregate, postprocess, preprocess",
        ),
        ("- just\n- a list\n", "YAML mapping"),
        ("name: [unclosed\n", "not valid YAML"),
    ],
)
def test_invalid_yaml_errors_name_the_file_and_field(tmp_path: Path, text: str, match: str) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(PipelineSpecError, match=match) as exc:
        load_pipeline(p)
    assert "bad.yaml" in str(exc.value)


GOOD = """
import numpy as np
import frameserve

class Base(frameserve.Pipeline):   # imported or not, only classes defined here count
    pass

class Mine(frameserve.Pipeline):
    name = "mine"
    models = {"m": "nudenet"}
    params = {"k": 1}
    def preprocess(self, frame):
        return {"x": np.zeros(3, np.float32)}
    def postprocess(self, frame, outputs):
        return {}
"""


def test_python_file_with_one_subclass_or_a_named_class(tmp_path: Path) -> None:
    f = tmp_path / "mine.py"
    f.write_text(
        GOOD.replace(
            "class Base(frameserve.Pipeline):   # imported or not, only classes defined here count\n    pass\n", ""
        )
    )
    d = load_pipeline(f)
    assert d.kind == "python" and d.load_class().name == "mine"
    two = tmp_path / "two.py"
    two.write_text(GOOD)
    with pytest.raises(PipelineHookError, match=r"exactly one frameserve.Pipeline subclass \(found: Base, Mine\)"):
        load_pipeline(two)
    assert load_pipeline(f"{two}:Mine").load_class().__name__ == "Mine"
    with pytest.raises(PipelineHookError, match="'Nope' is not a frameserve.Pipeline subclass"):
        load_pipeline(f"{two}:Nope")


@pytest.mark.parametrize(
    "body,match",
    [
        ("import nosuchmodule_xyz\n", r"does not import: ModuleNotFoundError.*\(bad.py line 1\)"),
        ("x = (\n", "does not import: SyntaxError"),
        ("import frameserve\nclass P(frameserve.Pipeline):\n    name = 'p'\n", "hook preprocess is missing"),
        (
            "import frameserve\nclass P(frameserve.Pipeline):\n    name = 'p'\n    def preprocess(self, f): return {}\n",
            "define process",
        ),
        (
            "import frameserve\nclass P(frameserve.Pipeline):\n    name = 'p'\n    batch = 0\n"
            "    def preprocess(self, f): return {}\n    def postprocess(self, f, o): return {}\n",
            "batch must be an int >= 1",
        ),
        (
            "import frameserve\nclass P(frameserve.Pipeline):\n    name = 'p'\n    def __init__(self, x): pass\n"
            "    def preprocess(self, f): return {}\n    def postprocess(self, f, o): return {}\n",
            "made with no arguments",
        ),
    ],
)
def test_bad_python_pipelines_are_one_line_errors(tmp_path: Path, body: str, match: str) -> None:
    f = tmp_path / "bad.py"
    f.write_text(body)
    with pytest.raises(PipelineHookError, match=match) as exc:
        load_pipeline(f)
    assert "\n" not in str(exc.value)


def test_merge_params_and_parse_param() -> None:
    base = {"a": 1, "nested": {"x": 1, "y": 2}}
    assert merge_params(base, {"nested.y": 5, "a": 2}, origin="o") == {"a": 2, "nested": {"x": 1, "y": 5}}
    assert merge_params(base, {"nested": {"x": 3}}, origin="o") == {"a": 1, "nested": {"x": 3, "y": 2}}
    with pytest.raises(PipelineSpecError, match="unknown param 'b'; accepted: a, nested"):
        merge_params(base, {"b": 1}, origin="o")
    assert parse_param("t=0.3") == ("t", 0.3) and parse_param("on=true") == ("on", True)
    assert parse_param("l=[1, 2]") == ("l", [1, 2]) and parse_param("s=hello") == ("s", "hello")
    with pytest.raises(PipelineSpecError, match="KEY=VALUE"):
        parse_param("novalue")


def test_hook_errors_name_the_users_line_and_the_rgb_hint(tmp_path: Path) -> None:
    from frameserve.pipeline._stages import hook_error
    from frameserve.pipeline.loader import near_hooks

    f = tmp_path / "u.py"
    f.write_text(
        "import frameserve\nclass U(frameserve.Pipeline):\n    name = 'u'\n"
        "    def preprocess(self, frame): return {}\n"
        "    def process(self, batch, models):\n        return batch[0].frame.rgb.shape\n"
        "    def rendr(self, frame, result): return None\n"
    )
    cls = load_pipeline(f).load_class()
    inst = instantiate(cls)

    class Item:
        class frame:  # noqa: N801 - a stand-in for FrameInfo
            rgb = None

    try:
        inst.process([Item()], {})
    except AttributeError as exc:
        err = hook_error(inst, "process", exc, "frame 0")
    assert "u.py line 6" in err.message and "needs_rgb = True" in err.message and "\n" not in err.message
    assert near_hooks(cls) == ["pipeline 'u': method rendr() is not a hook and is never called; did you mean render()?"]


def test_a_param_takes_a_value_of_its_defaults_kind() -> None:
    base = {"t": 0.5, "n": 3, "on": True, "name": "x", "sizes": [1], "free": None}
    assert (
        merge_params(base, {"t": 1, "n": 4, "on": False, "name": "y", "sizes": [2, 3], "free": "z"}, origin="o")["t"]
        == 1
    )
    for key, bad in (("t", "abc"), ("n", True), ("on", 1), ("name", 3), ("sizes", "1,2")):
        with pytest.raises(PipelineSpecError, match=f"param '{key}' takes "):
            merge_params(base, {key: bad}, origin="o")


def test_param_values_are_checked_against_their_defaults_at_every_depth() -> None:
    """A job's params arrive as JSON: a float for an int parameter, or a scalar for a nested
    mapping, is the client's error (400 at submit), not a TypeError inside a hook later."""
    from frameserve.errors import PipelineSpecError
    from frameserve.pipeline.loader import merge_params

    base = {"min_face_size": 20, "gain": 1.0, "detector": {"size": [640, 640], "iou": 0.45, "classes": {}}}
    merged = merge_params(base, {"min_face_size": 24.0, "gain": 2, "detector.iou": 0.5}, origin="p")
    assert merged["min_face_size"] == 24 and type(merged["min_face_size"]) is int and merged["gain"] == 2
    for bad, what in (
        ({"min_face_size": 88.5}, "takes an integer"),
        ({"min_face_size": 1e23}, "takes an integer"),
        ({"gain": float("inf")}, "takes a number"),
        ({"detector": {"size": 5}}, "takes a list"),
        ({"detector.size": 5}, "takes a list"),
        ({"detector": 3}, "is a mapping of parameters"),
        ({"min_face_size": True}, "takes an integer"),
    ):
        with pytest.raises(PipelineSpecError, match=what):
            merge_params(base, bad, origin="p")
    assert merge_params(base, {"detector": {"classes": {"FACE": 1}}}, origin="p")["detector"]["classes"] == {"FACE": 1}
