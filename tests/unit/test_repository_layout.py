from __future__ import annotations

from pathlib import Path

import pytest

from frameserve.errors import InvalidModelNameError, ModelConfigError, ModelNotFoundError
from frameserve.repository import ModelRepository, VersionPolicy

pytestmark = pytest.mark.unit


def _repo(tmp_path: Path, layout: dict[str, str]) -> ModelRepository:
    for rel, text in layout.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return ModelRepository(tmp_path)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (VersionPolicy(), [7]),
        (VersionPolicy("latest", num_versions=2), [3, 7]),
        (VersionPolicy("latest", num_versions=10), [1, 2, 3, 7]),
        (VersionPolicy("all"), [1, 2, 3, 7]),
        (VersionPolicy("specific", versions=(2, 7, 9)), [2, 7]),
        (VersionPolicy("specific", versions=(9,)), []),
    ],
)
def test_version_policy_select(policy: VersionPolicy, expected: list[int]) -> None:
    assert policy.select([3, 1, 7, 2]) == expected


def test_version_policy_round_trip_and_errors() -> None:
    for form in ({"latest": {"num_versions": 3}}, {"all": {}}, {"specific": {"versions": [1, 4]}}):
        assert VersionPolicy.from_dict(form).to_dict() == form
    assert VersionPolicy.from_dict(None) == VersionPolicy.from_dict({"latest": {}}) == VersionPolicy()
    with pytest.raises(ModelConfigError, match="supported values are latest, all, specific"):
        VersionPolicy("newest")  # type: ignore[arg-type]
    with pytest.raises(ModelConfigError, match="at least one version"):
        VersionPolicy("specific")


def test_models_versions_and_policy_from_config(tmp_path: Path) -> None:
    repo = _repo(
        tmp_path,
        {
            "b/config.yaml": "version_policy: {all: {}}\n",
            "b/1/model.onnx": "",
            "b/2/model.onnx": "",
            "b/notes/readme.txt": "",
            "a/3/model.onnx": "",
            "a/10/model.onnx": "",
            ".hidden/1/model.onnx": "",
            "README.md": "",
        },
    )
    assert repo.models() == ["a", "b"]
    assert repo.versions("a") == [10]  # latest 1 by default; numeric, not lexical
    assert repo.all_versions("a") == [3, 10]
    assert repo.versions("b") == [1, 2]
    assert repo.config("a").name == "a"  # no config.yaml: name from the folder


def test_missing_model_lists_available(tmp_path: Path) -> None:
    repo = _repo(tmp_path, {"alpha/1/model.onnx": "", "beta/1/model.onnx": ""})
    with pytest.raises(
        ModelNotFoundError, match="Request for unknown model: 'gamma' is not found; available: alpha, beta"
    ) as info:
        repo.config("gamma")
    assert str(tmp_path) not in str(info.value)  # a network client learns nothing of the file system
    with pytest.raises(InvalidModelNameError, match="one folder name") as bad:
        repo.versions("../alpha")
    assert "alpha" not in str(bad.value)
    with pytest.raises(InvalidModelNameError, match="at most 255 bytes of UTF-8; one of 5000 bytes") as long:
        repo.config("m" * 5000)
    assert "mmmm" not in str(long.value)


def test_model_file_by_backend_and_default_filename(tmp_path: Path) -> None:
    repo = _repo(
        tmp_path,
        {
            "ort/1/model.onnx": "",
            "ov/config.yaml": "backend: openvino\n",
            "ov/1/model.xml": "",
            "ov/1/model.onnx": "",
            "guess/1/model.xml": "",
            "named/config.yaml": "default_model_filename: detector.onnx\n",
            "named/1/detector.onnx": "",
        },
    )
    assert repo.model_file("ort", 1) == tmp_path / "ort/1/model.onnx"
    assert repo.model_file("ov", 1) == tmp_path / "ov/1/model.xml"  # IR preferred over ONNX
    assert repo.config("guess").backend == "openvino"  # backend follows the file when not given
    assert repo.model_file("named", 1) == tmp_path / "named/1/detector.onnx"


@pytest.mark.parametrize(
    "filename",
    [
        "../../../x/model.py",
        "../model.onnx",
        "/etc/passwd",
        "sub/model.onnx",
        "..\\model.onnx",
        "C:model.onnx",
        "..",
        ".",
        "a\0b",
        "x" * 300,
    ],
)
def test_default_model_filename_is_a_bare_file_name(tmp_path: Path, filename: str) -> None:
    # the file exists where the traversal points: the refusal must not depend on it
    repo = _repo(tmp_path / "repo", {"m/1/model.onnx": "", "m/model.onnx": ""})
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "model.py").write_text("raise SystemExit('ran')\n")
    messages = set()
    for override in ({"default_model_filename": filename}, {"default_model_filename": filename, "backend": "python"}):
        with pytest.raises(ModelConfigError, match="must be a bare file name") as info:
            repo.config("m", override=override)
        messages.add(str(info.value))
    assert len(messages) == 1 and str(tmp_path) not in messages.pop()
    with pytest.raises(ModelConfigError, match="must be a bare file name"):  # and in config.yaml
        (tmp_path / "repo" / "m" / "config.yaml").write_text(f"default_model_filename: {filename!r}\n")
        repo.model_file("m", 1)


def test_missing_model_file_names_path_and_accepted_names(tmp_path: Path) -> None:
    repo = _repo(tmp_path, {"m/1/weights.bin": "", "n/config.yaml": "backend: openvino\n", "n/2/x.txt": ""})
    with pytest.raises(
        ModelConfigError, match=r"no model file at m/1/model\.onnx; backend 'onnxruntime' accepts model\.onnx"
    ) as info:
        repo.model_file("m", 1)
    assert str(tmp_path) not in str(info.value)
    with pytest.raises(ModelConfigError, match=r"n/2/model\.xml; backend 'openvino' accepts model\.xml, model\.onnx"):
        repo.model_file("n", 2)
    with pytest.raises(ModelNotFoundError, match=r"model 'm' has no version 5; versions present: \[1\]"):
        repo.model_file("m", 5)


def test_bad_yaml_and_override(tmp_path: Path) -> None:
    repo = _repo(
        tmp_path,
        {
            "bad/config.yaml": "max_batch_size: [\n",
            "list/config.yaml": "- 1\n",
            "ok/config.yaml": "max_batch_size: 2\n",
        },
    )
    with pytest.raises(ModelConfigError, match=r"bad/config\.yaml: not valid YAML"):
        repo.config("bad")
    with pytest.raises(ModelConfigError, match=r"list/config\.yaml: a model config must be a mapping"):
        repo.config("list")
    assert repo.config("ok", override={"max_batch_size": 16}).max_batch_size == 16
    with pytest.raises(
        ModelConfigError, match=r"ok/config\.yaml \(with override\): invalid model config: max_batch_size"
    ):
        repo.config("ok", override={"max_batch_size": "many"})
    with pytest.raises(ModelConfigError, match="is not a folder"):
        ModelRepository(tmp_path / "nope")
