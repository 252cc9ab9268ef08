"""Where job inputs come from and outputs go: ``file://`` (only under configured roots),
``http(s)://`` (download only) and ``s3://`` (s3fs; multipart above a size), through fsspec.

Outputs are first written under a temporary key and then moved (file: ``os.replace``; S3: a
server-side copy) to their deterministic final key ``<target>/<name>``, so a retried or
concurrent attempt never leaves a half-written object under the final name.

Errors are sorted for the worker: :class:`SourceError` (refused, missing, 4xx: the job fails at
once) and :class:`StorageError` (timeouts, connection errors, 5xx: the attempt is retried).
HTTP downloads use httpx directly rather than fsspec's aiohttp file system: a streamed GET gives
the status code and a per-read timeout to sort errors by.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from frameserve.jobs._errors import SourceError, StorageError

__all__ = ["SOURCE_SCHEMES", "TARGET_SCHEMES", "Storage"]

SOURCE_SCHEMES = ("file", "http", "https", "s3")
TARGET_SCHEMES = ("file", "s3")

ChunkHook = Callable[[int], None]
"""Called with the bytes received so far after each downloaded chunk (may raise to abort)."""


@dataclass
class Storage:
    """Reads sources and writes outputs.

    Attributes:
        file_roots: folders ``file://`` sources and targets must lie under (after resolving
            symlinks); empty refuses every ``file://`` URI.
        s3_endpoint_url: an S3-compatible endpoint (MinIO, moto), or ``None`` for AWS.
        s3_options: extra ``s3fs.S3FileSystem`` keyword arguments (``key``, ``secret``, ...).
        http_timeout_s: connect / per-read timeout of HTTP downloads, seconds.
        multipart_chunk_bytes: S3 uploads larger than this go in parts of this size.
    """

    file_roots: Sequence[Path] = ()
    s3_endpoint_url: str | None = None
    s3_options: Mapping[str, Any] = field(default_factory=dict)
    http_timeout_s: float = 30.0
    multipart_chunk_bytes: int = 16 * 1024 * 1024
    _s3: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.file_roots = tuple(Path(os.path.realpath(r)) for r in self.file_roots)

    # ------------------------------------------------------------ checks at submit

    def _local(self, uri: str) -> Path:
        parts = urlsplit(uri)
        if parts.netloc not in ("", "localhost"):
            raise SourceError(f"file URI {uri!r} names host {parts.netloc!r}; only local files are read")
        path = Path(os.path.realpath(unquote(parts.path)))
        for root in self.file_roots:
            if path == root or path.is_relative_to(root):
                return path
        roots = ", ".join(str(r) for r in self.file_roots) or "none configured"
        raise SourceError(f"{uri!r} is not under an allowed file root ({roots}); see --file-root")

    def check_source(self, uri: str) -> None:
        """Refuse a source that can never be read. Raises :class:`SourceError` with the reason."""
        scheme = urlsplit(uri).scheme
        if scheme not in SOURCE_SCHEMES:
            raise SourceError(f"source scheme {scheme!r} is not supported; use one of {', '.join(SOURCE_SCHEMES)}")
        if scheme == "file":
            path = self._local(uri)
            if not path.is_file():
                raise SourceError(f"source {uri!r} does not exist or is not a file")
        elif scheme in ("http", "https") and not urlsplit(uri).hostname:
            raise SourceError(f"source {uri!r} has no host")
        elif scheme == "s3" and not urlsplit(uri).netloc:
            raise SourceError(f"source {uri!r} has no bucket")

    def check_target(self, uri: str) -> None:
        """Refuse a target prefix that can never be written. Raises :class:`SourceError`."""
        scheme = urlsplit(uri).scheme
        if scheme not in TARGET_SCHEMES:
            raise SourceError(f"target scheme {scheme!r} is not supported; use one of {', '.join(TARGET_SCHEMES)}")
        if scheme == "file":
            path = self._local(uri)
            probe = path
            while not probe.exists():
                probe = probe.parent
            if not probe.is_dir() or not os.access(probe, os.W_OK):
                raise SourceError(f"target {uri!r} is not writable")
        elif not urlsplit(uri).netloc:
            raise SourceError(f"target {uri!r} has no bucket")

    # ------------------------------------------------------------ download

    def download(self, uri: str, dest: Path, *, on_chunk: ChunkHook | None = None) -> Path:
        """Fetch ``uri`` to ``dest`` (or return the local path of a ``file://`` source).

        Raises:
            SourceError: refused, missing, 4xx (permanent).
            StorageError: timeout, connection failure, 5xx (retryable).
        """
        scheme = urlsplit(uri).scheme
        self.check_source(uri) if scheme != "file" else None
        dest.parent.mkdir(parents=True, exist_ok=True)
        if scheme == "file":
            path = self._local(uri)
            if not path.is_file():
                raise SourceError(f"source {uri!r} does not exist")
            if on_chunk is not None:
                on_chunk(path.stat().st_size)
            return path
        if scheme in ("http", "https"):
            return self._download_http(uri, dest, on_chunk)
        fs = self.s3()
        try:
            with fs.open(uri, "rb") as src, open(dest, "wb") as out:
                done = 0
                while chunk := src.read(1 << 20):
                    out.write(chunk)
                    done += len(chunk)
                    if on_chunk is not None:
                        on_chunk(done)
        except (FileNotFoundError, PermissionError) as exc:
            raise SourceError(f"source {uri!r}: {exc}") from exc
        except OSError as exc:
            raise StorageError(f"source {uri!r}: {exc}") from exc
        return dest

    def _download_http(self, uri: str, dest: Path, on_chunk: ChunkHook | None) -> Path:
        import httpx

        try:
            with httpx.stream("GET", uri, timeout=self.http_timeout_s, follow_redirects=True) as resp:
                if resp.status_code in (408, 429) or resp.status_code >= 500:
                    raise StorageError(f"source {uri!r}: HTTP {resp.status_code}")
                if resp.status_code >= 400:
                    raise SourceError(f"source {uri!r}: HTTP {resp.status_code}")
                done = 0
                with open(dest, "wb") as out:
                    for chunk in resp.iter_bytes(1 << 16):
                        out.write(chunk)
                        done += len(chunk)
                        if on_chunk is not None:
                            on_chunk(done)
        except httpx.TimeoutException as exc:
            raise StorageError(f"source {uri!r}: timed out ({exc.__class__.__name__})") from exc
        except httpx.TransportError as exc:
            raise StorageError(f"source {uri!r}: {exc}") from exc
        return dest

    # ------------------------------------------------------------ upload

    def s3(self) -> Any:
        """The (cached) s3fs file system."""
        if self._s3 is None:
            import s3fs

            opts: dict[str, Any] = {"skip_instance_cache": True, "use_listings_cache": False, **self.s3_options}
            if self.s3_endpoint_url:
                opts.setdefault("client_kwargs", {})["endpoint_url"] = self.s3_endpoint_url
            self._s3 = s3fs.S3FileSystem(**opts)
        return self._s3

    def upload(self, files: Mapping[str, Path], target: str) -> dict[str, str]:
        """Put each local file at ``<target>/<name>``: written under a temporary key first, then
        moved to the final key. Returns ``{name: final_uri}``.

        Raises:
            SourceError: the target is refused or access is denied (permanent).
            StorageError: a transient failure (retryable).
        """
        self.check_target(target)
        base = target.rstrip("/")
        tag = uuid.uuid4().hex[:12]
        out: dict[str, str] = {}
        if urlsplit(target).scheme == "file":
            folder = self._local(base)
            try:
                folder.mkdir(parents=True, exist_ok=True)
                for name, local in files.items():
                    tmp = folder / f".{name}.tmp-{tag}"
                    shutil.copyfile(local, tmp)
                    os.replace(tmp, folder / name)
                    out[name] = f"{base}/{name}"
            except PermissionError as exc:
                raise SourceError(f"target {target!r}: {exc}") from exc
            except OSError as exc:
                raise StorageError(f"target {target!r}: {exc}") from exc
            return out
        fs = self.s3()
        try:
            for name, local in files.items():
                tmp = f"{base}/.frameserve-tmp/{tag}/{name}"
                fs.put_file(str(local), tmp, chunksize=self.multipart_chunk_bytes)
                fs.copy(tmp, f"{base}/{name}")
                fs.rm(tmp)
                out[name] = f"{base}/{name}"
        except (PermissionError, FileNotFoundError) as exc:
            raise SourceError(f"target {target!r}: {exc}") from exc
        except OSError as exc:
            raise StorageError(f"target {target!r}: {exc}") from exc
        return out
