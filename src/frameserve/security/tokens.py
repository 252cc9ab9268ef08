"""Bearer tokens and roles: who a request comes from, and what it may do.

The token file (``frameserve serve --auth-token-file FILE``) holds one token a line::

    # TOKEN                                        ROLES          [NAME]
    kY1c0...43 more characters...                  infer
    Qm9v...                                        jobs,infer     batch-team
    ZXhh...                                        admin

- ``TOKEN``: at least :data:`MIN_TOKEN_CHARS` characters of RFC 6750's ``b64token`` alphabet
  (letters, digits, ``-._~+/``, trailing ``=``); ``python -c "import secrets;
  print(secrets.token_urlsafe(32))"`` makes one.
- ``ROLES``: a comma-separated subset of :data:`ROLES`: ``infer`` (v2 inference, metadata,
  config, statistics, shared memory, ``/v1/analyze``), ``jobs`` (``/v1/jobs``, its own jobs,
  and reading ``/v1/pipelines``), ``admin`` (everything: model control, every job).
- ``NAME`` (optional): a stable name for the token (jobs are owned by it); default: the first
  8 hex digits of the token's SHA-256.

Blank lines and lines starting with ``#`` are ignored. Anything else that does not fit is refused
when the server starts, with the line number (never the token).

Checking a token costs one SHA-256 and one dict lookup: the table is keyed by the tokens'
digests, so the time a lookup takes depends on the digest of what the client sent, which the
client cannot steer towards a stored one (nor learn a token's length from); the match is then
confirmed with :func:`hmac.compare_digest`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from pathlib import Path

from frameserve.errors import InvalidInputError, PermissionDeniedError, UnauthenticatedError

__all__ = ["IMPLICIT_OWNER", "MIN_TOKEN_CHARS", "ROLES", "Principal", "TokenTable", "bearer_token", "is_tenant_name"]

ROLES: tuple[str, ...] = ("admin", "infer", "jobs")
"""The roles a token may carry; ``admin`` may do everything."""

MIN_TOKEN_CHARS = 32
"""Shortest token accepted (32 characters of the b64token alphabet: over 190 bits when random)."""

_MAX_TOKEN_CHARS = 4096
_MAX_FILE_BYTES = 1 << 20
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")  # RFC 6750 section 2.1, b64token
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request comes from.

    Attributes:
        name: a stable name of the token (the token file's NAME, else the first 8 hex digits of
            the token's SHA-256); ``""`` for :data:`IMPLICIT_OWNER` (a server without tokens).
        roles: the token's roles, a subset of :data:`ROLES`.
    """

    name: str
    roles: frozenset[str]

    @property
    def is_admin(self) -> bool:
        """Whether the principal may do everything (role ``admin``)."""
        return "admin" in self.roles

    def allows(self, roles: frozenset[str]) -> bool:
        """Whether the principal holds ``admin`` or one of ``roles`` (an empty ``roles``: any
        authenticated principal)."""
        return not roles or "admin" in self.roles or not self.roles.isdisjoint(roles)


IMPLICIT_OWNER = Principal("", frozenset(ROLES))
"""The one principal of a server without tokens: every request is its, with every role."""


def is_tenant_name(name: str) -> bool:
    """Whether ``name`` is a token NAME (a tenant): 1 to 64 letters, digits and ``._@-``, starting
    with a letter or digit, so one path segment that is neither ``.`` nor ``..``. The implicit
    owner ``""`` is not one."""
    return _NAME.fullmatch(name) is not None


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` value (scheme case-insensitive,
    RFC 6750 section 2.1), or ``None`` when the value is absent, another scheme or malformed."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    if not token or len(token) > _MAX_TOKEN_CHARS:
        return None
    return token


class TokenTable:
    """The tokens a server accepts, each with its :class:`Principal`.

    Args:
        tokens: ``{token: principal}``; the tokens themselves are not kept, only their SHA-256.

    Raises:
        InvalidInputError: no tokens, or two tokens share a name.
    """

    def __init__(self, tokens: dict[str, Principal]) -> None:
        if not tokens:
            raise InvalidInputError("a token table needs at least one token")
        names = [p.name for p in tokens.values()]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise InvalidInputError(f"token names must be unique; used more than once: {', '.join(duplicates)}")
        self._by_digest: dict[bytes, tuple[bytes, Principal]] = {}
        for token, principal in tokens.items():
            digest = _digest(token)
            self._by_digest[digest] = (digest, principal)

    def __len__(self) -> int:
        return len(self._by_digest)

    def __repr__(self) -> str:
        return f"TokenTable({len(self)} tokens: {', '.join(self.names())})"

    def names(self) -> list[str]:
        """The principals' names, sorted."""
        return sorted(p.name for _, p in self._by_digest.values())

    @classmethod
    def from_file(cls, path: Path | str) -> TokenTable:
        """Read a token file (format in the module docstring).

        Raises:
            InvalidInputError: the file cannot be read, is over 1 MiB, or a line is malformed: a
                short token, a character outside the b64token alphabet, an unknown role, a bad
                name, a token given twice (the message names the line, never the token).
        """
        path = Path(path)
        try:
            size = path.stat().st_size
            if size > _MAX_FILE_BYTES:
                raise InvalidInputError(f"token file {path} is {size} bytes; at most {_MAX_FILE_BYTES} accepted")
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidInputError(f"cannot read token file {path}: {exc}") from None
        return cls.parse(text, source=str(path))

    @classmethod
    def parse(cls, text: str, *, source: str = "token file") -> TokenTable:
        """Parse the text of a token file (see :meth:`from_file`)."""
        tokens: dict[str, Principal] = {}
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            where = f"{source}, line {number}"
            fields = line.split()
            if len(fields) not in (2, 3):
                raise InvalidInputError(f"{where}: expected 'TOKEN ROLE[,ROLE...] [NAME]', got {len(fields)} fields")
            token, roles_text = fields[0], fields[1]
            if len(token) < MIN_TOKEN_CHARS:
                raise InvalidInputError(
                    f"{where}: the token has {len(token)} characters; at least {MIN_TOKEN_CHARS} are needed "
                    '(python -c "import secrets; print(secrets.token_urlsafe(32))" makes one)'
                )
            if len(token) > _MAX_TOKEN_CHARS or not _TOKEN.fullmatch(token):
                raise InvalidInputError(
                    f"{where}: a token is letters, digits and -._~+/ (RFC 6750 b64token), at most {_MAX_TOKEN_CHARS} characters"
                )
            roles = frozenset(r for r in roles_text.split(","))
            unknown = sorted(roles - set(ROLES))
            if unknown:
                raise InvalidInputError(
                    f"{where}: unknown role(s) {', '.join(map(repr, unknown))}; accepted: {', '.join(ROLES)}"
                )
            name = fields[2] if len(fields) == 3 else hashlib.sha256(token.encode()).hexdigest()[:8]
            if not _NAME.fullmatch(name):
                raise InvalidInputError(
                    f"{where}: a name is 1 to 64 letters, digits and ._@- (starting with a letter or digit)"
                )
            if token in tokens:
                raise InvalidInputError(f"{where}: this token is already given on an earlier line")
            tokens[token] = Principal(name, roles)
        if not tokens:
            raise InvalidInputError(f"{source}: no tokens (one 'TOKEN ROLE[,ROLE...] [NAME]' a line)")
        return cls(tokens)

    def principal(self, token: str) -> Principal | None:
        """The principal of ``token``, or ``None`` for a token not in the table."""
        digest = _digest(token)
        found = self._by_digest.get(digest)
        if found is None or not hmac.compare_digest(found[0], digest):
            return None
        return found[1]

    def authenticate(self, authorization: str | None, roles: frozenset[str] = frozenset()) -> Principal:
        """The principal of an ``Authorization`` value, checked against the route's ``roles``.

        Args:
            authorization: the header's (or gRPC metadata's) value, ``None`` when absent.
            roles: the roles that may use the route (any one suffices; ``admin`` always may;
                empty: any valid token).

        Raises:
            UnauthenticatedError: no bearer token, or one not in the table.
            PermissionDeniedError: the token holds none of ``roles``.
        """
        token = bearer_token(authorization)
        if token is None:
            raise UnauthenticatedError("this server needs a bearer token: send 'Authorization: Bearer TOKEN'")
        principal = self.principal(token)
        if principal is None:
            raise UnauthenticatedError("the bearer token is not valid")
        if not principal.allows(roles):
            raise PermissionDeniedError(
                f"token {principal.name!r} lacks the role this needs ({' or '.join(sorted(roles))}; it has "
                f"{', '.join(sorted(principal.roles))})"
            )
        return principal


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
