"""Where job inputs come from and outputs go: ``file://`` (only under configured roots),
``http(s)://`` (download only, through the address guard) and ``s3://`` (s3fs, only the allowed
buckets; multipart above a size), through fsspec.

What a client may make the server read is guarded (every byte from the network is hostile):

- ``file://``: the path (at most 4096 bytes, no NUL) must resolve, symlinks followed, under a
  file root; checking it takes time linear in the URI's length.
- ``http(s)://``: :class:`~frameserve.security.guard.AddressGuard` refuses hosts with any
  non-public address (unless ``sources_allow_private``); the connection goes to the address it
  checked (:class:`~frameserve.security.guard.GuardedTransport`: no DNS rebinding), redirects are
  followed here, at most ``max_redirects``, each hop checked again. Proxies from the environment
  are not used.
- ``s3://``: only the entries of ``s3_allow_buckets`` (none by default), sources and targets
  alike: ``bucket`` (any key) or ``bucket/prefix`` (keys under the prefix, whole segments);
  keys with ``.``, ``..`` or empty segments are refused.

Storage per tenant: every check, download and upload takes the ``tenant`` (a token's NAME, the
job's ``owner``; ``""`` is the implicit owner of a server without tokens). A file root or a
bucket prefix may hold the placeholder ``{tenant}`` as one whole segment (``/data/{tenant}``,
``media/{tenant}/``): the tenant sees only its own substitution (the implicit owner's is
``default``, :data:`IMPLICIT_TENANT_FOLDER`); only a valid name (:func:`tenant_folder`) is
substituted. A root or entry without the placeholder serves the implicit owner, and named
tenants only with ``shared_file_root`` (``--shared-file-root``). A ``file://`` path is resolved
(:func:`os.path.realpath`: symlinks and ``..``) and then checked against the tenant's resolved
roots, so neither leaves the tenant's prefix. Refusals name the URI given and the tenant's own
roots, never another tenant's.
- Downloads stop at ``max_source_bytes`` (the declared ``Content-Length`` first, then the bytes
  received), after ``source_timeout_s`` in all, or after ``http_timeout_s`` without a byte; a
  ``cancel`` event cuts the connection within :data:`_WATCH_S` seconds, whatever the source sends.

Outputs are first written under a temporary key and then moved (file: ``os.replace``; S3: a
server-side copy) to their deterministic final key ``<target>/<name>``, so a retried or
concurrent attempt never leaves a half-written object under the final name. A worker killed
between the write and the move leaves its temporary object; the job's retry removes it
(``upload(..., sweep=True)``), so a finished job leaves only its final objects.

A deleted job's outputs (``DELETE /v1/jobs/{id}?outputs=true``) are removed by
:meth:`Storage.delete_outputs`: only the keys its result lists, each exactly ``<target>/<name>``,
checked against the rules a target is checked with now (file roots, allowed buckets).

Errors are sorted for the worker: :class:`SourceError` (refused, missing, 4xx, too large, too
slow: the job fails at once) and :class:`StorageError` (idle timeouts, connection errors, 5xx: the
attempt is retried). Messages name URIs with their credentials redacted
(:func:`~frameserve.security.redact_uri`).
"""

from __future__ import annotations

import glob
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from frameserve.errors import AddressRefusedError, InvalidInputError
from frameserve.jobs._errors import SourceError, SourceTooLargeError, StorageError
from frameserve.security import AddressGuard, GuardedTransport, is_tenant_name, redact_uri
from frameserve.security.redact import quiet_http_logs

if TYPE_CHECKING:
    import httpx

__all__ = [
    "DEFAULT_MAX_SOURCE_BYTES",
    "IMPLICIT_TENANT_FOLDER",
    "SOURCE_SCHEMES",
    "TARGET_SCHEMES",
    "TENANT_PLACEHOLDER",
    "BucketRule",
    "Storage",
    "tenant_folder",
]

SOURCE_SCHEMES = ("file", "http", "https", "s3")
TARGET_SCHEMES = ("file", "s3")

DEFAULT_MAX_SOURCE_BYTES = 2 * 1024**3
"""Largest source downloaded by default, bytes (2 GiB; ``--max-source-bytes``)."""

_PATH_MAX_BYTES = 4096  # Linux PATH_MAX (limits.h), the longest path a system call accepts
_WATCH_S = 0.05  # how often a download's watcher looks at its cancel event and deadline
_SHOWN_CHARS = 300

TENANT_PLACEHOLDER = "{tenant}"
"""Stands for the tenant's folder in a file root or a bucket prefix (one whole segment)."""
IMPLICIT_TENANT_FOLDER = "default"
"""What :data:`TENANT_PLACEHOLDER` becomes for the implicit owner ``""`` (a server without tokens)."""

ChunkHook = Callable[[int], None]
"""Called with the bytes received so far after each downloaded chunk (may raise to abort)."""


def _show(uri: str) -> str:
    """A URI as messages show it: credentials redacted, cut to a few hundred characters."""
    text = redact_uri(uri)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + f"...({len(text)} characters)"


def tenant_folder(tenant: str) -> str:
    """The one path segment ``tenant`` stands for in a template: the name itself, or
    :data:`IMPLICIT_TENANT_FOLDER` for the implicit owner ``""``.

    Raises:
        SourceError: ``tenant`` is not a token name (1 to 64 letters, digits and ``._@-``,
            starting with a letter or digit): nothing else is ever substituted.
    """
    if tenant == "":
        return IMPLICIT_TENANT_FOLDER
    if not is_tenant_name(tenant):
        raise SourceError(
            f"tenant {tenant[:80]!r} cannot name a storage folder: a tenant is 1 to 64 letters, digits and ._@- "
            "(starting with a letter or digit)"
        )
    return tenant


def _check_template(text: str, what: str) -> None:
    """Refuse a template whose ``{tenant}`` is not a whole ``/``-segment, or that holds any other
    brace (a misspelt placeholder would silently be a shared folder)."""
    for seg in text.split("/"):
        if seg != TENANT_PLACEHOLDER and ("{" in seg or "}" in seg):
            raise InvalidInputError(
                f"{what} {text[:200]!r}: {TENANT_PLACEHOLDER} must be a whole path segment "
                f"(/data/{TENANT_PLACEHOLDER}, bucket/{TENANT_PLACEHOLDER}/) and is the only placeholder"
            )


@dataclass(frozen=True)
class BucketRule:
    """One ``--s3-allow-bucket`` entry: ``bucket`` (any key) or ``bucket/prefix`` (keys under it).

    Attributes:
        bucket: the bucket's name (never a placeholder).
        prefix: the prefix's segments, ``()`` for the whole bucket; may hold
            :data:`TENANT_PLACEHOLDER` as one segment.
    """

    bucket: str
    prefix: tuple[str, ...] = ()

    @classmethod
    def parse(cls, entry: str) -> BucketRule:
        """``bucket`` or ``bucket/prefix[/]``.

        Raises:
            InvalidInputError: no bucket, a placeholder in the bucket, ``.``/``..``/empty prefix
                segments, a placeholder that is not a whole segment.
        """
        text = entry.strip()
        bucket, _, rest = text.partition("/")
        what = "--s3-allow-bucket"
        if not bucket or "{" in bucket or "}" in bucket or "@" in bucket:
            raise InvalidInputError(
                f"{what} {text[:200]!r}: expected BUCKET or BUCKET/PREFIX ({TENANT_PLACEHOLDER} only in the prefix)"
            )
        rest = rest.rstrip("/")
        segments = tuple(rest.split("/")) if rest else ()
        if any(seg in ("", ".", "..") for seg in segments):
            raise InvalidInputError(f"{what} {text[:200]!r}: the prefix has an empty, '.' or '..' segment")
        _check_template(rest, what)
        return cls(bucket, segments)

    @property
    def templated(self) -> bool:
        """Whether the prefix holds :data:`TENANT_PLACEHOLDER` (the entry is per tenant)."""
        return TENANT_PLACEHOLDER in self.prefix

    def substitute(self, folder: str) -> BucketRule:
        """This entry with :data:`TENANT_PLACEHOLDER` replaced by ``folder`` (a
        :func:`tenant_folder`)."""
        return BucketRule(self.bucket, tuple(folder if seg == TENANT_PLACEHOLDER else seg for seg in self.prefix))

    def admits(self, bucket: str, key: tuple[str, ...], *, target: bool) -> bool:
        """Whether ``bucket`` and the key's segments lie under this entry (a target may be the
        prefix itself; a source is an object strictly under it)."""
        n = len(self.prefix)
        return bucket == self.bucket and key[:n] == self.prefix and (len(key) > n or (target and len(key) == n))

    def __str__(self) -> str:
        return self.bucket + "".join(f"/{seg}" for seg in self.prefix) + ("/" if self.prefix else "")


@dataclass
class Storage:
    """Reads sources and writes outputs.

    Attributes:
        file_roots: folders ``file://`` sources and targets must lie under (after resolving
            symlinks), each may hold :data:`TENANT_PLACEHOLDER` as one segment; empty refuses
            every ``file://`` URI.
        shared_file_root: let named tenants use the roots and bucket entries without
            :data:`TENANT_PLACEHOLDER` (``--shared-file-root``); without it those serve only the
            implicit owner ``""``.
        implicit_file_roots: the implicit owner's roots instead of ``file_roots`` substituted,
            or ``None`` (the default root: ``$FRAMESERVE_HOME/storage`` for ``""`` beside
            ``$FRAMESERVE_HOME/storage/{tenant}`` for named tenants).
        s3_endpoint_url: an S3-compatible endpoint (MinIO, moto), or ``None`` for AWS.
        s3_options: extra ``s3fs.S3FileSystem`` keyword arguments (``key``, ``secret``, ...).
        http_timeout_s: connect timeout and idle-read timeout of HTTP downloads (the longest
            wait for the next byte), seconds.
        multipart_chunk_bytes: S3 uploads larger than this go in parts of this size.
        sources_allow_private: let ``http(s)`` sources reach loopback, private and link-local
            addresses (``--sources-allow-private``).
        s3_allow_buckets: the ``bucket`` or ``bucket/prefix`` entries (:class:`BucketRule`)
            ``s3://`` sources and targets may name (``--s3-allow-bucket``).
        max_source_bytes: largest source, bytes (``--max-source-bytes``).
        source_timeout_s: longest download in all, seconds (``--source-timeout-s``).
        max_redirects: HTTP redirects followed per download.
    """

    file_roots: Sequence[str | os.PathLike[str]] = ()
    s3_endpoint_url: str | None = None
    s3_options: Mapping[str, Any] = field(default_factory=dict)
    http_timeout_s: float = 30.0
    multipart_chunk_bytes: int = 16 * 1024 * 1024
    sources_allow_private: bool = False
    s3_allow_buckets: Sequence[str] = ()
    max_source_bytes: int = DEFAULT_MAX_SOURCE_BYTES
    source_timeout_s: float = 1800.0
    max_redirects: int = 5
    shared_file_root: bool = False
    implicit_file_roots: Sequence[str | os.PathLike[str]] | None = None
    _s3: Any = field(default=None, init=False, repr=False)
    _rules: tuple[BucketRule, ...] = field(default=(), init=False, repr=False)

    def __post_init__(self) -> None:
        self.file_roots = tuple(Path(os.path.abspath(os.fspath(r))) for r in self.file_roots)
        for root in self.file_roots:
            _check_template(str(root), "--file-root")
        if self.implicit_file_roots is not None:
            self.implicit_file_roots = tuple(Path(os.path.abspath(os.fspath(r))) for r in self.implicit_file_roots)
        self.s3_allow_buckets = tuple(self.s3_allow_buckets)
        self._rules = tuple(BucketRule.parse(b) for b in self.s3_allow_buckets)
        if self.max_source_bytes < 1:
            raise ValueError(f"max_source_bytes must be >= 1, got {self.max_source_bytes}")
        if not self.source_timeout_s > 0 or not self.http_timeout_s > 0:
            raise ValueError(f"timeouts must be > 0, got {self.source_timeout_s}, {self.http_timeout_s}")
        quiet_http_logs()

    @property
    def guard(self) -> AddressGuard:
        """The address guard of ``http(s)`` sources."""
        return AddressGuard(allow_private=self.sources_allow_private, what="source", flag="--sources-allow-private")

    # ------------------------------------------------------------ checks at submit

    def shared(self) -> list[str]:
        """The roots and bucket entries without :data:`TENANT_PLACEHOLDER` (shared between named
        tenants when ``shared_file_root``, else theirs are refused), as the flags spell them."""
        roots = [str(r) for r in self.file_roots if TENANT_PLACEHOLDER not in str(r)]
        return roots + [f"s3://{rule}" for rule in self._rules if not rule.templated]

    def roots_for(self, tenant: str) -> tuple[Path, ...]:
        """``tenant``'s ``file://`` roots, resolved (symlinks followed) now: the templates with
        its folder substituted, then the roots without placeholder when it may use them.

        Raises:
            SourceError: ``tenant`` is not a valid name (:func:`tenant_folder`).
        """
        if tenant == "" and self.implicit_file_roots is not None:
            return tuple(Path(os.path.realpath(r)) for r in self.implicit_file_roots)
        folder = tenant_folder(tenant)
        out: list[Path] = []
        for root in self.file_roots:
            text = str(root)
            if TENANT_PLACEHOLDER in text:
                out.append(Path(os.path.realpath(text.replace(TENANT_PLACEHOLDER, folder))))
            elif tenant == "" or self.shared_file_root:
                out.append(Path(os.path.realpath(text)))
        return tuple(out)

    def rules_for(self, tenant: str) -> tuple[BucketRule, ...]:
        """``tenant``'s ``s3://`` entries: the templated ones substituted, then the others when it
        may use them. Raises :class:`SourceError` for an invalid name."""
        folder = tenant_folder(tenant)
        return tuple(
            rule.substitute(folder) if rule.templated else rule
            for rule in self._rules
            if rule.templated or tenant == "" or self.shared_file_root
        )

    def _withheld(self, tenant: str, s3: bool) -> str:
        """Why a named tenant lacks roots the operator configured (shared ones, withheld)."""
        kept = [x for x in self.shared() if x.startswith("s3://") == s3]
        if not tenant or self.shared_file_root or not kept:
            return ""
        return (
            f"; roots without {TENANT_PLACEHOLDER} ({', '.join(kept)}) are shared between tenants only with "
            "--shared-file-root"
        )

    def _local(self, uri: str, tenant: str, what: str) -> Path:
        parts = urlsplit(uri)
        if parts.netloc not in ("", "localhost"):
            raise SourceError(f"file URI {_show(uri)!r} names host {parts.netloc[:100]!r}; only local files are read")
        raw = unquote(parts.path)
        if "\x00" in raw:
            raise SourceError(f"file URI {_show(uri)!r} holds a NUL byte (%00); a path cannot")
        if len(raw.encode("utf-8", "surrogateescape")) > _PATH_MAX_BYTES:
            raise SourceError(f"file URI {_show(uri)!r}: the path is longer than {_PATH_MAX_BYTES} bytes")
        roots = self.roots_for(tenant)
        path = Path(os.path.realpath(raw))
        for root in roots:
            if path == root or path.is_relative_to(root):
                return path
        whose = f" of tenant {tenant!r}" if tenant else ""
        shown = ", ".join(str(r) for r in roots) or "none configured"
        raise SourceError(
            f"{what} {_show(uri)!r} is not under an allowed file root{whose} ({shown}; symlinks and '..' resolved); "
            "see --file-root" + self._withheld(tenant, s3=False)
        )

    def _bucket(self, uri: str, what: str, tenant: str) -> None:
        rest = uri.split("://", 1)[1] if "://" in uri else ""
        bucket, _, key_text = rest.partition("/")
        if not bucket:
            raise SourceError(f"{what} {_show(uri)!r} has no bucket")
        if "@" in bucket:
            raise SourceError(f"{what} {_show(uri)!r} carries credentials; the server's own S3 credentials are used")
        target = what == "target"
        if target:
            key_text = key_text.rstrip("/")  # a prefix: <target>/<name> is written
        key = tuple(key_text.split("/")) if key_text else ()
        if any(seg in ("", ".", "..") for seg in key) or (not target and not key):
            raise SourceError(
                f"{what} {_show(uri)!r}: an S3 key has no empty, '.' or '..' segments"
                + ("" if target else " and names an object")
            )
        rules = self.rules_for(tenant)
        if any(rule.admits(bucket, key, target=target) for rule in rules):
            return
        if not rules:
            raise SourceError(
                f"{what} {_show(uri)!r}: no bucket is allowed"
                + (f" to tenant {tenant!r}" if tenant else "")
                + "; allow one with --s3-allow-bucket BUCKET[/PREFIX] (env FRAMESERVE_S3_ALLOW_BUCKETS)"
                + self._withheld(tenant, s3=True)
            )
        allowed = ", ".join(f"s3://{rule}" for rule in rules)
        raise SourceError(
            f"{what} {_show(uri)!r} is not under "
            + (f"tenant {tenant!r}'s" if tenant else "the")
            + f" allowed buckets and prefixes ({allowed}); see --s3-allow-bucket"
            + self._withheld(tenant, s3=True)
        )

    def _scheme(self, uri: str, accepted: tuple[str, ...], what: str) -> str:
        try:
            scheme = urlsplit(uri).scheme
        except ValueError as exc:
            raise SourceError(f"{what} {_show(uri)!r} is not a valid URI: {exc}") from None
        if scheme not in accepted:
            raise SourceError(f"{what} scheme {scheme[:20]!r} is not supported; use one of {', '.join(accepted)}")
        return scheme

    def check_source(self, uri: str, *, tenant: str) -> None:
        """Refuse a source ``tenant`` can never read: a refused scheme, a file outside the
        tenant's roots or missing, an ``http(s)`` host with a non-public address (resolved now;
        checked again at download), a bucket or key outside the tenant's entries.

        Raises:
            SourceError: with the reason (and the tenant's own roots or entries).
            AddressRefusedError: the host is refused.
        """
        scheme = self._scheme(uri, SOURCE_SCHEMES, "source")
        if scheme == "file":
            path = self._local(uri, tenant, "source")
            try:
                is_file = path.is_file()
            except OSError as exc:  # a name over NAME_MAX, EACCES...: not a file this server reads
                raise SourceError(f"source {_show(uri)!r} cannot be read: {exc.strerror}") from None
            if not is_file:
                raise SourceError(f"source {_show(uri)!r} does not exist or is not a file")
        elif scheme in ("http", "https"):
            self.guard.check_url(uri, _show(uri))
        else:
            self._bucket(uri, "source", tenant)

    def check_target(self, uri: str, *, tenant: str) -> None:
        """Refuse a target prefix ``tenant`` can never write: outside its roots or bucket entries,
        or not writable. Raises :class:`SourceError`."""
        scheme = self._scheme(uri, TARGET_SCHEMES, "target")
        if scheme == "file":
            path = self._local(uri, tenant, "target")
            probe = path
            try:
                while not probe.exists():
                    probe = probe.parent
                writable = probe.is_dir() and os.access(probe, os.W_OK)
            except OSError as exc:  # a name over NAME_MAX...: never writable
                raise SourceError(f"target {_show(uri)!r} is not writable: {exc.strerror}") from None
            if not writable:
                raise SourceError(f"target {_show(uri)!r} is not writable")
        else:
            self._bucket(uri, "target", tenant)

    # ------------------------------------------------------------ download

    def download(
        self,
        uri: str,
        dest: Path,
        *,
        tenant: str,
        on_chunk: ChunkHook | None = None,
        cancel: threading.Event | None = None,
        max_bytes: int | None = None,
        max_bytes_flag: str = "--max-source-bytes",
    ) -> Path:
        """Fetch ``uri`` to ``dest`` (or return the resolved local path of a ``file://`` source),
        checked again against ``tenant``'s roots and bucket entries.

        Args:
            uri: the source.
            dest: where a downloaded source is written.
            tenant: whose source it is (the job's owner; ``""`` the implicit owner).
            on_chunk: called with the bytes received so far (may raise to abort).
            cancel: when set, the download stops within :data:`_WATCH_S` s (:class:`StorageError`).
            max_bytes: a lower cap than ``max_source_bytes`` (``/v1/analyze``), named in errors by
                ``max_bytes_flag``.

        Raises:
            SourceError: refused, missing, 4xx, over the size cap (:class:`SourceTooLargeError`),
                over ``source_timeout_s`` (permanent). AddressRefusedError: a refused host.
            StorageError: idle timeout, connection failure, 5xx, cancelled (retryable).
        """
        limit, flag = self.max_source_bytes, "--max-source-bytes"
        if max_bytes is not None and max_bytes < limit:
            limit, flag = max_bytes, max_bytes_flag
        scheme = self._scheme(uri, SOURCE_SCHEMES, "source")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if scheme == "file":
            path = self._local(uri, tenant, "source")
            if not path.is_file():
                raise SourceError(f"source {_show(uri)!r} does not exist")
            size = path.stat().st_size
            if size > limit:
                raise SourceTooLargeError(
                    f"source {_show(uri)!r} is {size} bytes, over the limit of {limit} bytes ({flag})"
                )
            if on_chunk is not None:
                on_chunk(size)
            return path
        if scheme in ("http", "https"):
            return self._download_http(uri, dest, on_chunk, cancel, limit, flag)
        self._bucket(uri, "source", tenant)
        return self._download_s3(uri, dest, on_chunk, cancel, limit, flag)

    def _download_s3(
        self, uri: str, dest: Path, on_chunk: ChunkHook | None, cancel: threading.Event | None, limit: int, flag: str
    ) -> Path:
        deadline = time.monotonic() + self.source_timeout_s
        fs = self.s3()
        try:
            with fs.open(uri, "rb") as src, open(dest, "wb") as out:
                size = getattr(src, "size", None)
                if isinstance(size, int) and size > limit:
                    raise SourceTooLargeError(
                        f"source {_show(uri)!r} is {size} bytes, over the limit of {limit} bytes ({flag})"
                    )
                done = 0
                while chunk := src.read(1 << 20):
                    out.write(chunk)
                    done += len(chunk)
                    if done > limit:
                        raise SourceTooLargeError(f"source {_show(uri)!r} is over the limit of {limit} bytes ({flag})")
                    if cancel is not None and cancel.is_set():
                        raise StorageError(f"download of {_show(uri)!r} cancelled")
                    if time.monotonic() > deadline:
                        raise SourceError(
                            f"source {_show(uri)!r} did not download within {self.source_timeout_s:g} s (--source-timeout-s)"
                        )
                    if on_chunk is not None:
                        on_chunk(done)
        except (FileNotFoundError, PermissionError) as exc:
            raise SourceError(f"source {_show(uri)!r}: {exc}") from exc
        except OSError as exc:
            raise StorageError(f"source {_show(uri)!r}: {exc}") from exc
        return dest

    def _download_http(
        self, uri: str, dest: Path, on_chunk: ChunkHook | None, cancel: threading.Event | None, limit: int, flag: str
    ) -> Path:
        import httpx

        shown = _show(uri)
        transport = GuardedTransport(self.guard)
        deadline = time.monotonic() + self.source_timeout_s
        why: list[str] = []
        finished = threading.Event()

        def watch() -> None:  # cuts the connection on cancel or at the deadline, whatever the read waits on
            while not finished.wait(_WATCH_S):
                if cancel is not None and cancel.is_set():
                    why.append("cancelled")
                elif time.monotonic() >= deadline:
                    why.append("timeout")
                else:
                    continue
                transport.abort()
                return

        def stopped() -> Exception | None:
            if not why:
                return None
            if why[0] == "cancelled":
                return StorageError(f"download of {shown!r} cancelled")
            return SourceError(
                f"source {shown!r} did not download within {self.source_timeout_s:g} s (--source-timeout-s)"
            )

        watcher = threading.Thread(target=watch, name="frameserve-download-watch", daemon=True)
        watcher.start()
        try:
            with httpx.Client(
                transport=transport,
                timeout=httpx.Timeout(self.http_timeout_s),
                follow_redirects=False,
                trust_env=False,
                headers={"accept-encoding": "identity"},
            ) as client:
                url = httpx.URL(uri)
                for _ in range(self.max_redirects + 1):
                    with client.stream("GET", url) as resp:
                        nxt = resp.next_request if resp.is_redirect else None
                        if nxt is None:
                            self._write_body(resp, dest, shown, on_chunk, limit, flag)
                            if (err := stopped()) is not None:  # a cut connection can look like the end of a body
                                raise err
                            return dest
                    url = nxt.url
                    if url.scheme not in ("http", "https"):
                        raise SourceError(
                            f"source {shown!r} redirects to a {url.scheme[:20]!r} URL; only http(s) is followed"
                        )
                raise SourceError(f"source {shown!r}: more than {self.max_redirects} redirects")
        except AddressRefusedError:
            raise
        except httpx.TimeoutException as exc:
            raise stopped() or StorageError(
                f"source {shown!r}: timed out ({exc.__class__.__name__}, no byte for {self.http_timeout_s:g} s)"
            ) from exc
        except httpx.UnsupportedProtocol as exc:
            raise SourceError(f"source {shown!r} leads to an unsupported URL: {exc}") from exc
        except httpx.TransportError as exc:
            raise stopped() or StorageError(f"source {shown!r}: {exc.__class__.__name__}: {exc}") from exc
        except httpx.InvalidURL as exc:
            raise SourceError(f"source {shown!r} is not a valid URL: {exc}") from exc
        finally:
            finished.set()
            watcher.join()

    @staticmethod
    def _write_body(
        resp: httpx.Response, dest: Path, shown: str, on_chunk: ChunkHook | None, limit: int, flag: str
    ) -> None:
        if resp.status_code in (408, 429) or resp.status_code >= 500:
            raise StorageError(f"source {shown!r}: HTTP {resp.status_code}")
        if resp.status_code >= 400:
            raise SourceError(f"source {shown!r}: HTTP {resp.status_code}")
        if resp.status_code >= 300:
            raise SourceError(f"source {shown!r}: HTTP {resp.status_code} without a usable Location")
        declared = resp.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise SourceTooLargeError(f"source {shown!r} is {declared} bytes, over the limit of {limit} bytes ({flag})")
        done = 0
        with open(dest, "wb") as out:
            for chunk in resp.iter_bytes():
                done += len(chunk)
                if done > limit:
                    raise SourceTooLargeError(f"source {shown!r} is over the limit of {limit} bytes ({flag})")
                out.write(chunk)
                if on_chunk is not None:
                    on_chunk(done)

    # ------------------------------------------------------------ upload

    def s3(self) -> Any:  # Any: an s3fs.S3FileSystem (s3fs ships no types)
        """The (cached) s3fs file system."""
        if self._s3 is None:
            import s3fs

            opts: dict[str, Any] = {"skip_instance_cache": True, "use_listings_cache": False, **self.s3_options}
            if self.s3_endpoint_url:
                opts.setdefault("client_kwargs", {})["endpoint_url"] = self.s3_endpoint_url
            self._s3 = s3fs.S3FileSystem(**opts)
        return self._s3

    def upload(self, files: Mapping[str, Path], target: str, *, tenant: str, sweep: bool = False) -> dict[str, str]:
        """Put each local file at ``<target>/<name>``: written under a temporary key first, then
        moved to the final key. Returns ``{name: final_uri}``. ``target`` is checked against
        ``tenant``'s roots and bucket entries first (:meth:`check_target`).

        ``sweep`` first removes the temporary objects earlier attempts left under ``target``
        (file: ``.<name>.tmp-*``; S3: ``<target>/.frameserve-tmp/``): an attempt killed between
        its write and its move leaves one. The worker sweeps on a job's retries only (the one
        lease holder: no live attempt's temporary object is there to lose; should one vanish
        anyway, its move fails with a retryable :class:`StorageError`).

        Raises:
            SourceError: the target is refused or access is denied (permanent).
            StorageError: a transient failure (retryable).
        """
        self.check_target(target, tenant=tenant)
        base = target.rstrip("/")
        tag = uuid.uuid4().hex[:12]
        out: dict[str, str] = {}
        if urlsplit(target).scheme == "file":
            folder = self._local(base, tenant, "target")
            try:
                folder.mkdir(parents=True, exist_ok=True)
                if sweep:
                    for name in files:
                        for left in folder.glob(f".{glob.escape(name)}.tmp-*"):
                            left.unlink(missing_ok=True)
                for name, local in files.items():
                    tmp = folder / f".{name}.tmp-{tag}"
                    shutil.copyfile(local, tmp)
                    os.replace(tmp, folder / name)
                    out[name] = f"{base}/{name}"
            except PermissionError as exc:
                raise SourceError(f"target {_show(target)!r}: {exc}") from exc
            except OSError as exc:
                raise StorageError(f"target {_show(target)!r}: {exc}") from exc
            return out
        fs = self.s3()
        try:
            if sweep:
                try:
                    fs.rm(f"{base}/.frameserve-tmp", recursive=True)
                except FileNotFoundError:  # nothing left behind
                    pass
            for name, local in files.items():
                key = f"{base}/.frameserve-tmp/{tag}/{name}"
                fs.put_file(str(local), key, chunksize=self.multipart_chunk_bytes)
                try:
                    fs.copy(key, f"{base}/{name}")
                except FileNotFoundError as exc:  # our own object, just written, is gone: not the client's fault
                    raise StorageError(
                        f"target {_show(target)!r}: the temporary object vanished before its move: {exc}"
                    ) from exc
                fs.rm(key)
                out[name] = f"{base}/{name}"
        except (PermissionError, FileNotFoundError) as exc:
            raise SourceError(f"target {_show(target)!r}: {exc}") from exc
        except OSError as exc:
            raise StorageError(f"target {_show(target)!r}: {exc}") from exc
        return out

    # ------------------------------------------------------------ delete

    def delete_outputs(self, target: str, outputs: Mapping[str, str], *, tenant: str) -> list[str]:
        """Remove a finished job's outputs: each ``{name: uri}`` of its ``result.outputs`` whose
        URI is exactly ``<target>/<name>`` (a plain name: no ``/``, not ``.`` or ``..``), and
        nothing else (the folder, other objects under the target, stay). A missing object is
        not an error (already gone). Returns the URIs removed. ``tenant`` is the job's owner:
        the target must lie in that tenant's storage today.

        Raises:
            SourceError: the target is no longer allowed (the owner's file roots, buckets), or
                an output is not the job's own key (nothing is removed then).
            StorageError: a transient failure (the caller may try again).
        """
        self.check_target(target, tenant=tenant)
        base = target.rstrip("/")
        for name, uri in outputs.items():
            if not name or "/" in name or name in (".", "..") or uri != f"{base}/{name}":
                raise SourceError(f"output {_show(uri)!r} is not {_show(base)}/<name>; it is not removed")
        removed: list[str] = []
        try:
            if urlsplit(target).scheme == "file":
                folder = self._local(base, tenant, "target")
                for name, uri in outputs.items():
                    path = folder / name
                    if path.is_file() or path.is_symlink():
                        path.unlink(missing_ok=True)
                        removed.append(uri)
                return removed
            fs = self.s3()
            for _name, uri in outputs.items():
                if fs.exists(uri):
                    fs.rm_file(uri)
                    removed.append(uri)
        except PermissionError as exc:
            raise SourceError(f"target {_show(target)!r}: {exc}") from exc
        except OSError as exc:
            raise StorageError(f"target {_show(target)!r}: {exc}") from exc
        return removed
