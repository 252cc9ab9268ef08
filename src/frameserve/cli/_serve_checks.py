"""The start-up checks of ``frameserve serve`` (:mod:`frameserve.cli.serve`): what it refuses
(:class:`~frameserve.errors.InvalidInputError`, exit 2) or warns about on stderr before it
listens (exposure without tokens, storage shared between tenants, unknown ``--load-model``
names, a token file others may read), and the lines it prints about security and storage."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from frameserve.security.auth import is_loopback

if TYPE_CHECKING:
    from frameserve.security import TokenTable
    from frameserve.security.quotas import Quotas

__all__ = [
    "check_exposure",
    "check_startup_models",
    "check_tenancy",
    "read_quotas",
    "read_tokens",
    "redact",
    "security_line",
    "warn",
]


def check_tenancy(js: object, *, tenants: bool) -> str:
    """Refuse (exit 2) storage shared between tenants by accident: with tokens, a file root or
    S3 entry without ``{tenant}`` needs ``--shared-file-root``. Returns the line to print about
    storage (``storage: per tenant: ...`` or ``storage: SHARED between tenants ...``; none
    without tokens unless ``--shared-file-root`` was given).

    Raises:
        InvalidInputError: the root or entry, and both ways out (``{tenant}``, the flag).
    """
    from frameserve.errors import InvalidInputError
    from frameserve.jobs.settings import JobsSettings

    assert isinstance(js, JobsSettings)
    shared = js.storage().shared()
    if not tenants:
        return "storage: shared between tenants (--shared-file-root)" if js.shared_file_root else ""
    if shared and not js.shared_file_root:
        first = shared[0]
        if first.startswith("s3://"):
            flag, fix = "--s3-allow-bucket", f"--s3-allow-bucket {first.removeprefix('s3://').rstrip('/')}/{{tenant}}/"
            shown = first.removeprefix("s3://")
        else:
            flag, fix, shown = "--file-root", f"--file-root {first.rstrip('/')}/{{tenant}}", first
        more = f" (and {len(shared) - 1} more: {', '.join(shared[1:])})" if len(shared) > 1 else ""
        raise InvalidInputError(
            f"{flag} {shown} has no {{tenant}}{more}: with --auth-token-file every tenant could read and overwrite the "
            f"others' files there. Confine each tenant to its own prefix ({fix}), or pass --shared-file-root "
            "(env FRAMESERVE_SHARED_FILE_ROOT=1) to share it between tenants on purpose"
        )
    if shared:
        return f"storage: SHARED between tenants (--shared-file-root): {', '.join(shared)}"
    return f"storage: per tenant: {', '.join([*map(str, js.file_roots), *(f's3://{b}' for b in js.s3_allow_buckets)])}"


def read_quotas(path: Path | None) -> Quotas:
    """The quotas of ``--quotas`` (the built-in defaults without one). Raises
    :class:`~frameserve.errors.InvalidInputError` naming the file and the key (exit 2)."""
    from frameserve.security.quotas import Quotas

    return Quotas() if path is None else Quotas.load(path)


def read_tokens(path: Path | None) -> TokenTable | None:
    """The token table of ``--auth-token-file`` (``None`` without one); warns on stderr when the
    file may be read by other users."""
    from frameserve.security import TokenTable

    if path is None:
        return None
    table = TokenTable.from_file(path)
    try:
        if path.stat().st_mode & 0o077:
            warn(f"the token file {path} may be read by other users; chmod 600 it")
    except OSError:  # pragma: no cover - it was just read
        pass
    return table


def check_startup_models(names: tuple[str, ...], available: list[str]) -> None:
    """Refuse a ``--load-model`` that names no model of the repository (exit 2)."""
    from frameserve.errors import InvalidInputError

    missing = [n for n in names if n != "*" and n not in available]
    if missing:
        raise InvalidInputError(
            f"--load-model {', '.join(missing)}: no such model in the repository; available: {', '.join(available) or '(none)'}"
        )


def check_exposure(options: object, *, allow_unauthenticated: bool) -> None:
    """Refuse (exit 2) a listener on a non-loopback address without tokens, unless allowed;
    warn when tokens would cross the network in clear text."""
    from frameserve.errors import InvalidInputError
    from frameserve.server import ServerOptions

    assert isinstance(options, ServerOptions)
    kinds = [
        k
        for k, port in (("http", options.http_port), ("grpc", options.grpc_port), ("metrics", options.metrics_port))
        if port is not None
    ]
    exposed = sorted({options.host_for(k) for k in kinds if not is_loopback(options.host_for(k))})
    if not exposed:
        return
    if options.tokens is None:
        if not allow_unauthenticated:
            raise InvalidInputError(
                f"refusing to serve {', '.join(exposed)} without authentication: give --auth-token-file, "
                "bind loopback (the default --host 127.0.0.1), or pass --allow-unauthenticated when something "
                "in front of the server (a gateway) checks every request"
            )
        warn(
            f"serving {', '.join(exposed)} WITHOUT authentication (--allow-unauthenticated): anyone who reaches it may use it"
        )
    elif not options.tls:
        warn(
            f"bearer tokens cross the network to {', '.join(exposed)} in clear text: give --tls-cert/--tls-key "
            "or end TLS at an ingress in front of the server"
        )


def security_line(options: object) -> str:
    """The start-up line about access: model control mode, bearer tokens (how many, health and
    metrics too or not) and TLS, e.g. ``model control mode none; authentication off; TLS off``."""
    from frameserve.server import ServerOptions

    assert isinstance(options, ServerOptions)
    tokens = options.tokens
    auth = (
        "off"
        if tokens is None
        else f"{len(tokens)} bearer token(s)" + (", health and metrics too" if options.auth_health else "")
    )
    return (
        f"model control mode {options.model_control_mode}; authentication {auth}; TLS {'on' if options.tls else 'off'}"
    )


def warn(message: str) -> None:
    """Print ``warning: message`` on stderr (bold yellow on a terminal)."""
    from rich.text import Text

    from frameserve.cli._common import err_console

    err_console.print(Text.assemble(("warning:", "bold yellow"), " ", message), highlight=False, soft_wrap=True)


def redact(url: str) -> str:
    """An SQLAlchemy URL with its password hidden."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable URL>"
