"""Token files, principals and the route policy (frameserve.security), without a server."""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path

import pytest

from frameserve.errors import InvalidInputError, PermissionDeniedError, UnauthenticatedError, UnsupportedMediaTypeError
from frameserve.security import (
    IMPLICIT_OWNER,
    MIN_TOKEN_CHARS,
    Principal,
    TokenTable,
    bearer_token,
    cross_site_refusal,
    grpc_roles,
    http_roles,
)
from frameserve.security.auth import host_refusal

pytestmark = pytest.mark.unit

T1, T2, T3 = (secrets.token_urlsafe(32) for _ in range(3))


def test_token_file_lines_roles_and_names(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"# comment\n\n  {T1} infer\n{T2}\tjobs,infer  batch-team\n{T3} admin\n")
    table = TokenTable.from_file(path)
    assert len(table) == 3 and T1 not in repr(table)
    assert table.principal(T1) == Principal(hashlib.sha256(T1.encode()).hexdigest()[:8], frozenset({"infer"}))
    assert table.principal(T2) == Principal("batch-team", frozenset({"jobs", "infer"}))
    assert table.principal(T3) is not None and table.principal(T3).is_admin  # type: ignore[union-attr]
    assert table.principal(T1 + "x") is None and table.principal("") is None
    assert table.authenticate(f"Bearer {T1}", frozenset({"infer"})).name == table.principal(T1).name  # type: ignore[union-attr]
    assert table.authenticate(f"bearer  {T3} ", frozenset({"jobs"})).is_admin  # admin may do everything
    with pytest.raises(UnauthenticatedError, match="needs a bearer token"):
        table.authenticate(None, frozenset({"infer"}))
    with pytest.raises(UnauthenticatedError, match="needs a bearer token"):
        table.authenticate(f"Basic {T1}", frozenset({"infer"}))
    with pytest.raises(UnauthenticatedError, match="not valid"):
        table.authenticate(f"Bearer {T1[:-1]}", frozenset({"infer"}))
    with pytest.raises(PermissionDeniedError, match="lacks the role this needs \\(admin; it has infer\\)"):
        table.authenticate(f"Bearer {T1}", frozenset({"admin"}))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no tokens"),
        ("# only a comment\n", "no tokens"),
        ("short infer\n", f"line 1: the token has 5 characters; at least {MIN_TOKEN_CHARS}"),
        (f"{T1}\n", "line 1: expected 'TOKEN ROLE"),
        (f"{T1} infer name extra\n", "expected 'TOKEN ROLE"),
        (f"{T1} infer,root\n", "unknown role(s) 'root'; accepted: admin, infer, jobs"),
        (f"{T1} Infer\n", "unknown role(s) 'Infer'"),
        (f"{'é' * 40} infer\n", "RFC 6750 b64token"),
        (f"{T1} infer a/b\n", "a name is 1 to 64"),
        (f"{T1} infer\n{T1} jobs\n", "line 2: this token is already given"),
        (f"{T1} infer same\n{T2} jobs same\n", "token names must be unique; used more than once: same"),
    ],
)
def test_bad_token_files_are_refused_without_echoing_tokens(text: str, message: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        TokenTable.parse(text, source="tokens.txt")
    assert message in str(info.value) and T1 not in str(info.value)


def test_bearer_token_and_principals() -> None:
    assert bearer_token("Bearer abc") == "abc" and bearer_token("BEARER abc") == "abc"
    assert bearer_token(None) is None and bearer_token("Bearer ") is None and bearer_token("Token abc") is None
    assert bearer_token("Bearer " + "a" * 5000) is None
    assert IMPLICIT_OWNER.name == "" and IMPLICIT_OWNER.allows(frozenset({"admin"}))
    jobs = Principal("j", frozenset({"jobs"}))
    assert (
        jobs.allows(frozenset()) and jobs.allows(frozenset({"jobs", "infer"})) and not jobs.allows(frozenset({"infer"}))
    )


def test_route_roles() -> None:
    infer, jobs, admin = frozenset({"infer"}), frozenset({"jobs"}), frozenset({"admin"})
    assert http_roles("GET", "/v2/health/ready") is None and http_roles("GET", "/metrics") is None
    assert http_roles("GET", "/v2/health/live", auth_health=True) == frozenset()
    assert http_roles("POST", "/v2/models/m/infer") == infer and http_roles("GET", "/v2") == infer
    assert http_roles("POST", "/v2/repository/index") == infer
    assert http_roles("POST", "/v2/repository/models/m/load") == admin
    assert http_roles("POST", "/v2/repository/models/m/unload") == admin
    assert http_roles("POST", "/v1/jobs") == jobs and http_roles("POST", "/v1/jobs/abc/cancel") == jobs
    assert http_roles("POST", "/v1/analyze") == infer
    assert http_roles("GET", "/v1/pipelines") == frozenset({"jobs", "infer"})
    assert http_roles("GET", "/docs") == frozenset() and http_roles("GET", "/nope") == frozenset()
    svc = "/inference.GRPCInferenceService/"
    assert grpc_roles(svc + "ServerLive") is None and grpc_roles("/grpc.health.v1.Health/Check") is None
    assert grpc_roles(svc + "ServerReady", auth_health=True) == frozenset()
    assert grpc_roles(svc + "ModelInfer") == infer and grpc_roles(svc + "ModelStreamInfer") == infer
    assert grpc_roles(svc + "RepositoryModelLoad") == admin and grpc_roles(svc + "LogSettings") == admin
    assert http_roles("GET", "/v2/logging") == admin and http_roles("POST", "/v2/logging") == admin
    assert http_roles("GET", "/v2/trace/setting") == admin and http_roles("POST", "/v2/models/m/trace/setting") == admin
    assert grpc_roles(svc + "TraceSetting") == admin and http_roles("POST", "/v2/models/trace/infer") == infer


def _refusal(method: str = "POST", path: str = "/v2/repository/models/m/load", **headers: str | None) -> object:
    fields = {"host": "127.0.0.1:8000", "origin": None, "fetch_site": None, "content_type": None}
    fields.update(headers)
    return cross_site_refusal(method, path, **fields)  # type: ignore[arg-type]


def test_cross_site_refusals() -> None:
    assert _refusal() is None  # no Origin, no Content-Type: tritonclient, curl
    assert _refusal(origin="http://127.0.0.1:8000", content_type="application/json") is None
    assert _refusal(origin="https://api.example.com", host="api.example.com") is None  # TLS ended at an ingress
    assert _refusal(origin="https://API.example.com:443", host="api.example.com") is None
    assert _refusal(method="GET", origin="http://evil.example", content_type="text/plain") is None  # reads pass
    for origin in (
        "http://evil.example",
        "http://127.0.0.1:8001",
        "null",
        "http://127.0.0.1.evil.example:8000",
        "file://",
    ):
        assert isinstance(_refusal(origin=origin), PermissionDeniedError), origin
    assert isinstance(_refusal(origin="http://127.0.0.1:8000", host=None), PermissionDeniedError)
    assert isinstance(_refusal(fetch_site="cross-site"), PermissionDeniedError)
    assert _refusal(fetch_site="same-origin") is None
    for ctype in (
        "text/plain",
        "Text/Plain; charset=utf-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=b",
    ):
        assert isinstance(_refusal(content_type=ctype), UnsupportedMediaTypeError), ctype
        assert isinstance(_refusal(method="DELETE", path="/v1/jobs/x", content_type=ctype), UnsupportedMediaTypeError)
    assert _refusal(path="/v1/analyze", content_type="multipart/form-data; boundary=b") is None  # uploads
    assert isinstance(_refusal(path="/v1/analyze", origin="http://evil.example"), PermissionDeniedError)
    assert _refusal(path="/v2/models/m/infer", content_type="application/octet-stream") is None
    # perf_analyzer's libcurl default on the shared-memory routes (never a JSON object body)
    form = "application/x-www-form-urlencoded"
    assert _refusal(path="/v2/systemsharedmemory/region/r/register", content_type=form) is None
    assert _refusal(path="/v2/cudasharedmemory/unregister", content_type=form) is None
    assert isinstance(
        _refusal(path="/v2/systemsharedmemory/unregister", content_type="text/plain"), UnsupportedMediaTypeError
    )
    assert isinstance(_refusal(path="/v2/repository/models/m/load", content_type=form), UnsupportedMediaTypeError)
    assert isinstance(
        _refusal(path="/v2/systemsharedmemory/unregister", content_type=form, origin="http://evil.example"),
        PermissionDeniedError,
    )


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "LOCALHOST:8000",
        "api.localhost",
        "localhost.",
        "127.0.0.1",
        "127.1.2.3:8000",
        "[::1]",
        "[::1]:8000",
    ],
)
def test_hosts_that_name_this_machine_pass(host: str) -> None:
    for _ in range(2):  # the second answer comes from the cache: the same
        assert host_refusal(host) is None


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:8000",
        "10.0.0.1",
        "0.0.0.0",
        "[::2]",
        "localhost.evil.example",
        "127.0.0.1.nip.io",
        "",
        ":8000",
        "[::1",
        "a" * 300 + ".localhost",
        "localhost:notaport",
    ],
)
def test_other_hosts_are_refused_without_echoing_them(host: str) -> None:
    for _ in range(2):
        refusal = host_refusal(host)
        assert isinstance(refusal, PermissionDeniedError)
        assert host[:20] not in str(refusal) or not host


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("LOCALHOST", True),
        ("localhost.", True),
        ("app.localhost", True),
        ("App.LocalHost.", True),
        ("127.0.0.1", True),
        ("127.9.8.7", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("[::ffff:7f00:1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.1", False),
        ("localhost.example", False),
        ("notlocalhost", False),
        ("::ffff:10.0.0.1", False),
        ("", False),
        ("127.0.0.1.nip.io", False),
    ],
)
def test_one_loopback_definition(host: str, loopback: bool) -> None:
    from frameserve.security.auth import is_loopback

    assert is_loopback(host) is loopback
