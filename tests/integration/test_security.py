"""Issue 11, items 1 and 2: model control as Triton's, no file outside a version folder, bearer
tokens with roles, cross-site refusals and TLS, probed with real servers (uvicorn + gRPC in a
thread, ``frameserve serve`` in a subprocess) and the real clients (httpx, tritonclient.http,
tritonclient.grpc). Each probe failed on the code before this change."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import ipaddress
import json
import os
import secrets
import shutil
import ssl
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from _models import add_model, scale_model
from _serving import ServeProcess, frameserve_command
from _wait import wait_for
from fastapi import APIRouter, Request
from tritonclient.utils import InferenceServerException

from frameserve._proto import grpc_service_pb2 as tpb
from frameserve._proto import grpc_service_pb2_grpc as tpb_grpc
from frameserve.jobs.api import create_pipelines_router
from frameserve.pipeline.registry import PipelineRegistry
from frameserve.repository import ModelRepository
from frameserve.security import TokenTable
from frameserve.server import Server, ServerOptions
from frameserve.service import InferenceService

pytestmark = pytest.mark.integration

TOKENS = {role: secrets.token_urlsafe(32) for role in ("infer", "jobs", "admin")}
BAD_TOKEN = secrets.token_urlsafe(32)
_MODEL_PY = """\
import pathlib
pathlib.Path(__file__).with_name("RAN").write_text("this file was imported by the server")


class TritonPythonModel:
    def execute(self, requests):
        return []
"""


def _make_repo(root: Path) -> Path:
    """``add`` (FP32 a, b -> sum, diff) and ``half`` (FP32 x -> x * 0.5), both batching, at ``root``."""
    add_model(root / "add" / "1" / "model.onnx")
    scale_model(root / "half" / "1" / "model.onnx", shape=("batch", 4), scale=0.5)
    return root


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``<tmp>/x`` beside ``<tmp>/repo``: what ``../../../x/`` from a version folder reaches."""
    base = tmp_path_factory.mktemp("sec")
    folder = base / "x"
    folder.mkdir()
    (folder / "model.py").write_text(_MODEL_PY)
    (folder / "exists.onnx").write_bytes(b"not an onnx model")
    _make_repo(base / "repo")
    return folder


@pytest.fixture(scope="module")
def repo(outside: Path) -> Path:
    return outside.parent / "repo"


@contextlib.contextmanager
def _serving(repo: Path, *, strict_readiness: bool = True, wait: bool = True, **options: Any) -> Iterator[Server]:
    service = InferenceService(ModelRepository(repo), threads=1, strict_readiness=strict_readiness)
    server = Server(service, ServerOptions(host="127.0.0.1", http_port=0, grpc_port=0, metrics_port=0, **options))
    server.start()
    try:
        if wait:
            server.wait_ready(60)
        yield server
    finally:
        server.stop(timeout_s=30)


def _http(server: Server, scheme: str = "http", **kwargs: Any) -> httpx.Client:
    return httpx.Client(base_url=f"{scheme}://127.0.0.1:{server.http_port}", timeout=30, trust_env=False, **kwargs)


def _bearer(role: str | None) -> dict[str, str]:
    if role is None:
        return {}
    return {"Authorization": f"Bearer {BAD_TOKEN if role == 'bad' else TOKENS[role]}"}


def _grpc_code(call: Callable[[], Any]) -> str | None:
    try:
        call()
    except InferenceServerException as exc:
        return str(exc.status())
    return None


def _infer_http(client: httpclient.InferenceServerClient, **kwargs: Any) -> np.ndarray:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    inputs = [httpclient.InferInput(n, [1, 4], "FP32") for n in ("a", "b")]
    for i in inputs:
        i.set_data_from_numpy(a, binary_data=True)
    return client.infer("add", inputs, **kwargs).as_numpy("sum")


# -- model control --------------------------------------------------------------------------


def test_load_and_unload_are_refused_in_modes_none_and_poll(repo: Path) -> None:
    for mode in ("none", "poll"):
        options = {} if mode == "none" else {"model_control_mode": mode}  # none: the default
        with _serving(repo, **options) as server:
            assert server.ready
            client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
            gclient = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
            with pytest.raises(InferenceServerException, match="explicit model load / unload is not allowed") as info:
                client.unload_model("half")
            assert info.value.status() == "503"
            with pytest.raises(InferenceServerException, match="explicit model load / unload is not allowed"):
                client.load_model("half")
            assert _grpc_code(lambda g=gclient: g.unload_model("half")) == "StatusCode.UNAVAILABLE"
            assert _grpc_code(lambda g=gclient: g.load_model("half")) == "StatusCode.UNAVAILABLE"
            assert client.is_model_ready("half") and gclient.is_model_ready("half")  # nothing changed
            index = {e["name"]: e["state"] for e in client.get_model_repository_index()}
            assert index == {"add": "READY", "half": "READY"}  # the index still lists
            client.close()
            gclient.close()


def test_explicit_mode_loads_only_the_named_models_and_an_unload_keeps_the_server_ready(repo: Path) -> None:
    with _serving(repo, model_control_mode="explicit", startup_models=("add",)) as server:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
        gclient = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        assert client.is_server_ready() and client.is_model_ready("add") and not client.is_model_ready("half")
        index = {e["name"]: e["state"] for e in client.get_model_repository_index()}
        assert index == {"add": "READY", "half": "UNAVAILABLE"}
        client.load_model("half")
        assert client.is_model_ready("half")
        client.unload_model("half")  # the old code turned the whole server not ready here
        assert not client.is_model_ready("half")
        assert client.is_server_ready() and gclient.is_server_ready() and server.ready
        gclient.load_model("half")
        gclient.unload_model("add")
        assert gclient.is_server_ready() and not gclient.is_model_ready("add")
        with _http(server) as http:
            assert http.get("/v2/health/ready").status_code == 200
        client.close()
        gclient.close()
    with _serving(repo, model_control_mode="explicit", startup_models=("*",)) as server:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
        assert client.is_model_ready("add") and client.is_model_ready("half") and client.is_server_ready()
        client.close()


def test_strict_readiness_counts_models_that_failed_to_load(repo: Path, tmp_path: Path) -> None:
    broken = shutil.copytree(repo, tmp_path / "repo")
    (broken / "bad" / "1").mkdir(parents=True)
    (broken / "bad" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    with _serving(broken) as server, _http(server) as http:
        assert not server.ready and http.get("/v2/health/ready").status_code == 503
        reason = next(e["reason"] for e in http.post("/v2/repository/index").json() if e["name"] == "bad")
        assert "Protobuf parsing failed" in reason and str(tmp_path) not in reason  # no server path leaks
    with _serving(broken, strict_readiness=False) as server, _http(server) as http:
        assert server.ready and http.get("/v2/health/ready").status_code == 200
    with _serving(broken, model_control_mode="explicit", startup_models=("*",)) as server, _http(server) as http:
        assert http.get("/v2/health/ready").status_code == 503
        r = http.post("/v2/repository/models/bad/load")
        assert r.status_code == 400 and str(tmp_path) not in r.json()["error"]
        assert http.post("/v2/repository/models/bad/unload").status_code == 200  # unloaded on purpose
        assert http.get("/v2/health/ready").status_code == 200


def test_poll_mode_follows_the_repository(repo: Path, tmp_path: Path) -> None:
    polled = shutil.copytree(repo, tmp_path / "repo")
    with _serving(polled, model_control_mode="poll", repository_poll_s=0.2) as server:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
        staging = tmp_path / "staging"
        scale_model(staging / "1" / "model.onnx", shape=("batch", 4), scale=3.0)
        staging.rename(polled / "triple")  # complete when it appears
        wait_for(lambda: client.is_model_ready("triple"), 60, "the added model loaded")
        (polled / "half" / "config.yaml").write_text("max_batch_size: 2\n")
        wait_for(lambda: client.get_model_config("half").get("max_batch_size") == 2, 60, "the changed model reloaded")
        shutil.rmtree(polled / "triple")
        wait_for(lambda: not client.is_model_ready("triple"), 60, "the removed model unloaded")
        assert client.is_server_ready()
        with pytest.raises(InferenceServerException, match="not allowed in model control mode 'poll'"):
            client.load_model("half")
        client.close()


# -- what a request may name ----------------------------------------------------------------


def test_a_config_override_never_names_a_file_outside_the_version_folder(repo: Path, outside: Path) -> None:
    with _serving(repo, model_control_mode="explicit", startup_models=("add",)) as server, _http(server) as http:
        gclient = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")

        def load(filename: str, backend: str) -> httpx.Response:
            config = json.dumps({"backend": backend, "default_model_filename": filename})
            return http.post("/v2/repository/models/half/load", json={"parameters": {"config": config}})

        for filename in ("../../../x/model.py", str(outside / "model.py")):  # code execution on the old code
            r = load(filename, "python")
            assert r.status_code == 400, r.text
            config = json.dumps({"backend": "python", "default_model_filename": filename})
            assert _grpc_code(lambda c=config: gclient.load_model("half", config=c)) == "StatusCode.INVALID_ARGUMENT"
        assert not (outside / "RAN").exists()
        answers = set()
        for name in ("exists.onnx", "missing.onnx"):  # an existence oracle on the old code
            for filename in (f"../../../x/{name}", str(outside / name)):
                r = load(filename, "onnxruntime")
                assert r.status_code == 400
                answers.add(r.json()["error"])
        assert len(answers) == 1
        message = answers.pop()
        assert "bare file name" in message and str(outside.parent) not in message and "exists" not in message
        assert not server.service.is_ready("half") and server.ready
        gclient.close()


def test_a_5000_character_model_name_is_a_400_that_does_not_echo_it(repo: Path) -> None:
    name = "m" * 5000
    with _serving(repo, model_control_mode="explicit", startup_models=("add",)) as server, _http(server) as http:
        for r in (
            http.get(f"/v2/models/{name}"),
            http.get(f"/v2/models/{name}/ready"),
            http.post(f"/v2/models/{name}/infer", json={"inputs": []}),
            http.post(f"/v2/repository/models/{name}/load"),
        ):
            # a load answers as Triton's failed repository poll does (500); the others 400
            assert r.status_code == (500 if r.request.url.path.endswith("/load") else 400), r.text
            assert "at most 255 bytes" in r.json()["error"] and len(r.text) < 300
        gclient = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        with pytest.raises(InferenceServerException) as info:
            gclient.get_model_metadata(name)
        assert str(info.value.status()) == "StatusCode.INVALID_ARGUMENT" and len(info.value.message()) < 300
        gclient.close()


# -- DNS rebinding ----------------------------------------------------------------------------


def test_a_loopback_server_without_tokens_answers_only_requests_addressed_to_this_machine(repo: Path) -> None:
    """A page on evil.example whose name is made to resolve to 127.0.0.1 is same-origin for the
    browser; only its Host header gives it away."""
    with _serving(repo, model_control_mode="explicit", startup_models=("add",)) as server, _http(server) as http:
        port = server.http_port
        for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.nip.io:{port}", f"10.0.0.5:{port}"):
            for r in (
                http.get("/v2/health/ready", headers={"Host": host}),
                http.post("/v2/repository/models/add/unload", headers={"Host": host, "Origin": f"http://{host}"}),
            ):
                assert r.status_code == 403 and "addressed to this machine" in r.json()["error"], (host, r.text)
                assert "evil" not in r.text
        for host in (
            f"127.0.0.1:{port}",
            f"localhost:{port}",
            f"[::1]:{port}",
            f"app.localhost:{port}",
            f"127.3.4.5:{port}",
        ):
            assert http.get("/v2/health/ready", headers={"Host": host}).status_code == 200, host
        assert server.service.is_ready("add")  # the refused unload did nothing


@pytest.mark.parametrize("bind", ["LOCALHOST", "Localhost"])
def test_every_spelling_of_loopback_keeps_the_host_check(repo: Path, bind: str) -> None:
    """One loopback definition for the bind, the token requirement and the Host check: a server
    bound as ``LOCALHOST`` or ``localhost.`` (no tokens needed) still refuses rebinding."""
    service = InferenceService(ModelRepository(repo), threads=1)
    server = Server(service, ServerOptions(host=bind, http_port=0, grpc_port=None, metrics_port=None))
    server.start()
    try:
        assert server.wait_ready(60)
        with httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}", timeout=30) as http:
            r = http.get("/v2/health/ready", headers={"Host": "evil.example"})
            assert r.status_code == 403 and "addressed to this machine" in r.json()["error"], r.text
            assert http.get("/v2/health/ready").status_code == 200
    finally:
        server.stop(timeout_s=30)


# -- cross-site requests --------------------------------------------------------------------


def test_cross_site_requests_are_refused_on_state_changing_routes(repo: Path) -> None:
    with _serving(repo, model_control_mode="explicit", startup_models=("*",)) as server, _http(server) as http:
        own = f"http://127.0.0.1:{server.http_port}"
        unload = "/v2/repository/models/half/unload"
        for content_type in (
            "text/plain",
            "text/plain;charset=UTF-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
        ):
            r = http.post(unload, content=b"{}", headers={"Content-Type": content_type})
            assert r.status_code == 415, (content_type, r.text)
        for headers in (
            {"Origin": "http://evil.example"},
            {"Origin": f"http://127.0.0.1:{server.http_port + 1}"},
            {"Origin": "null"},
            {"Sec-Fetch-Site": "cross-site"},
        ):
            r = http.post(unload, headers=headers)
            assert r.status_code == 403 and "cross-site" in r.json()["error"], headers
        body = {"inputs": [{"name": n, "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]} for n in ("a", "b")]}
        r = http.post("/v2/models/add/infer", content=json.dumps(body), headers={"Content-Type": "text/plain"})
        assert r.status_code == 415
        assert (
            http.get("/v2/models/half/ready", headers={"Origin": "http://evil.example"}).status_code == 200
        )  # reads pass
        assert server.service.is_ready("half")  # nothing was unloaded
        # the server's own pages, non-browser clients and tritonclient (no Content-Type) still work
        assert http.post(unload, json={}, headers={"Origin": own, "Sec-Fetch-Site": "same-origin"}).status_code == 200
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
        client.load_model("half")
        assert client.is_model_ready("half")
        np.testing.assert_array_equal(_infer_http(client), 2 * np.arange(4, dtype=np.float32).reshape(1, 4))
        r = http.post("/v2/models/add/infer", json=body)
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2, 4, 6, 8]
        client.close()


# -- tokens and roles -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tokens") / "tokens.txt"
    path.write_text(
        f"# token roles [name]\n\n{TOKENS['infer']} infer\n{TOKENS['jobs']}   jobs\n{TOKENS['admin']} admin ops\n"
    )
    path.chmod(0o600)
    return path


def _whoami_router() -> APIRouter:
    """``GET /v1/jobs/whoami``: the principal the gate put in ``request.state`` (what the job API reads)."""
    router = APIRouter(prefix="/v1/jobs")

    @router.get("/whoami")
    def whoami(request: Request) -> dict[str, Any]:
        p = request.state.principal
        return {"name": p.name, "roles": sorted(p.roles)}

    return router


@pytest.fixture(scope="module")
def guarded(repo: Path, token_file: Path) -> Iterator[Server]:
    routers = (_whoami_router(), create_pipelines_router(PipelineRegistry()))
    with _serving(
        repo,
        model_control_mode="explicit",
        startup_models=("*",),
        tokens=TokenTable.from_file(token_file),
        http_routers=routers,
    ) as server:
        yield server


_INFER_BODY = {"inputs": [{"name": n, "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]} for n in ("a", "b")]}
# (method, path, JSON body, roles that may call it; None = open)
_ROUTES: list[tuple[str, str, Any, set[str] | None]] = [
    ("GET", "/v2/health/live", None, None),
    ("GET", "/v2/health/ready", None, None),
    ("GET", "/metrics", None, None),
    ("GET", "/v2", None, {"infer"}),
    ("GET", "/v2/models/add", None, {"infer"}),
    ("GET", "/v2/models/add/ready", None, {"infer"}),
    ("GET", "/v2/models/add/config", None, {"infer"}),
    ("GET", "/v2/models/stats", None, {"infer"}),
    ("POST", "/v2/repository/index", {}, {"infer"}),
    ("POST", "/v2/models/add/infer", _INFER_BODY, {"infer"}),
    ("GET", "/v1/jobs/whoami", None, {"jobs"}),
    ("GET", "/v1/pipelines", None, {"jobs", "infer"}),
    ("POST", "/v2/repository/models/half/load", None, {"admin"}),
    ("GET", "/openapi.json", None, {"infer", "jobs"}),  # any valid token
]


@pytest.mark.parametrize("who", [None, "bad", "infer", "jobs", "admin"])
def test_http_roles_matrix(guarded: Server, who: str | None) -> None:
    with _http(guarded) as http:
        for method, path, body, roles in _ROUTES:
            r = http.request(method, path, json=body, headers=_bearer(who))
            if roles is None or (who in {"infer", "jobs", "admin"} and (who == "admin" or who in roles)):
                assert r.status_code == 200, (who, path, r.text)
            elif who in (None, "bad"):
                assert r.status_code == 401, (who, path)
                challenge = r.headers["www-authenticate"]
                assert challenge.startswith("Bearer") and ('error="invalid_token"' in challenge) == (who == "bad")
                assert TOKENS["infer"] not in r.text and BAD_TOKEN not in r.text
            else:
                assert r.status_code == 403 and "lacks the role" in r.json()["error"], (who, path)
    if who in ("jobs", "admin"):
        me = _http(guarded).get("/v1/jobs/whoami", headers=_bearer(who)).json()
        expected = "ops" if who == "admin" else hashlib.sha256(TOKENS["jobs"].encode()).hexdigest()[:8]
        assert me == {"name": expected, "roles": [who]}


def test_tritonclient_http_and_grpc_pass_tokens_as_headers(guarded: Server) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{guarded.http_port}")
    assert client.is_server_ready()  # health is open
    with pytest.raises(InferenceServerException) as info:
        _infer_http(client)
    assert info.value.status() == "401"
    np.testing.assert_array_equal(
        _infer_http(client, headers=_bearer("infer")), 2 * np.arange(4, dtype=np.float32).reshape(1, 4)
    )
    with pytest.raises(InferenceServerException) as info:
        client.load_model("half", headers=_bearer("infer"))
    assert info.value.status() == "403"
    client.load_model("half", headers=_bearer("admin"))
    client.close()

    gclient = grpcclient.InferenceServerClient(f"127.0.0.1:{guarded.grpc_port}")
    meta = {k.lower(): v for k, v in _bearer("infer").items()}
    assert gclient.is_server_live() and gclient.is_server_ready()  # health is open
    assert _grpc_code(lambda: gclient.get_model_metadata("add")) == "StatusCode.UNAUTHENTICATED"
    bad = {"authorization": f"Bearer {BAD_TOKEN}"}
    assert _grpc_code(lambda: gclient.get_model_metadata("add", headers=bad)) == "StatusCode.UNAUTHENTICATED"
    jobs = {"authorization": f"Bearer {TOKENS['jobs']}"}
    assert _grpc_code(lambda: gclient.get_model_metadata("add", headers=jobs)) == "StatusCode.PERMISSION_DENIED"
    assert gclient.get_model_metadata("add", headers=meta).name == "add"
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    inputs = [grpcclient.InferInput(n, [1, 4], "FP32") for n in ("a", "b")]
    for i in inputs:
        i.set_data_from_numpy(a)
    np.testing.assert_array_equal(gclient.infer("add", inputs, headers=meta).as_numpy("sum"), 2 * a)
    assert _grpc_code(lambda: gclient.load_model("half", headers=meta)) == "StatusCode.PERMISSION_DENIED"
    gclient.load_model("half", headers={"authorization": f"Bearer {TOKENS['admin']}"})
    gclient.close()

    with grpc.insecure_channel(f"127.0.0.1:{guarded.grpc_port}") as channel:  # a streaming RPC is refused too
        stub = tpb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            list(stub.ModelStreamInfer(iter([tpb.ModelInferRequest(model_name="add")]), timeout=10))
        assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED


def test_health_and_metrics_can_ask_for_tokens_too(repo: Path, token_file: Path) -> None:
    tokens = TokenTable.from_file(token_file)
    with _serving(repo, tokens=tokens, auth_health=True) as server, _http(server) as http:
        assert http.get("/v2/health/ready").status_code == 401
        assert http.get("/v2/health/ready", headers=_bearer("jobs")).status_code == 200  # any valid token
        metrics = f"http://127.0.0.1:{server.metrics_port}/metrics"
        assert httpx.get(metrics, trust_env=False).status_code == 401
        assert httpx.get(metrics, headers=_bearer("infer"), trust_env=False).status_code == 200
        gclient = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        assert _grpc_code(gclient.is_server_ready) == "StatusCode.UNAUTHENTICATED"
        assert gclient.is_server_ready(headers={"authorization": f"Bearer {TOKENS['jobs']}"})
        gclient.close()


# -- TLS ------------------------------------------------------------------------------------


def _self_signed(folder: Path) -> tuple[Path, Path]:
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_file, key_file


def test_tls_on_http_grpc_and_metrics(repo: Path, tmp_path: Path, token_file: Path) -> None:
    cert, key = _self_signed(tmp_path)
    trust = ssl.create_default_context(cafile=str(cert))
    tokens = TokenTable.from_file(token_file)
    with _serving(repo, tokens=tokens, tls_cert_file=cert, tls_key_file=key) as server:
        with _http(server, "https", verify=trust) as https:
            assert https.get("/v2/health/ready").status_code == 200
            assert https.get("/v2/models/add", headers=_bearer("infer")).json()["name"] == "add"
        with pytest.raises(httpx.HTTPError), _http(server) as plain:  # no plaintext on the TLS port
            plain.get("/v2/health/ready")
        assert (
            httpx.get(f"https://127.0.0.1:{server.metrics_port}/metrics", verify=trust, trust_env=False).status_code
            == 200
        )
        gclient = grpcclient.InferenceServerClient(
            f"localhost:{server.grpc_port}", ssl=True, root_certificates=str(cert)
        )
        assert gclient.is_server_live()
        assert gclient.get_model_metadata("add", headers={"authorization": f"Bearer {TOKENS['infer']}"}).name == "add"
        gclient.close()
    with pytest.raises(Exception, match="TLS"):
        ServerOptions(tls_cert_file=cert)


# -- the CLI --------------------------------------------------------------------------------


def _serve_exit(repo: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *frameserve_command(),
            "serve",
            "--model-repository",
            str(repo),
            "--no-jobs",
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "FRAMESERVE_HOME": str(home)},
        stdin=subprocess.DEVNULL,
    )


def test_cli_refuses_unsafe_starts(repo: Path, tmp_path: Path) -> None:
    for args in (("--host", "0.0.0.0"), ("--http-address", "0.0.0.0")):
        done = _serve_exit(repo, tmp_path, *args)
        assert done.returncode == 2, done.stderr
        assert (
            "refusing to serve 0.0.0.0 without authentication" in done.stderr
            and "--allow-unauthenticated" in done.stderr
        )
    short = tmp_path / "short.txt"
    short.write_text("abc123 infer\n")
    done = _serve_exit(repo, tmp_path, "--auth-token-file", str(short))
    assert done.returncode == 2 and "line 1: the token has 6 characters; at least 32" in done.stderr
    assert "abc123" not in done.stderr
    unknown = tmp_path / "unknown.txt"
    unknown.write_text(f"{TOKENS['infer']} infer,root\n")
    done = _serve_exit(repo, tmp_path, "--auth-token-file", str(unknown))
    assert done.returncode == 2 and "unknown role(s) 'root'; accepted: admin, infer, jobs" in done.stderr
    done = _serve_exit(repo, tmp_path, "--load-model", "add")
    assert done.returncode == 2 and "need model control mode 'explicit'" in done.stderr
    done = _serve_exit(repo, tmp_path, "--model-control-mode", "explicit", "--load-model", "ghost")
    assert done.returncode == 2 and "--load-model ghost: no such model" in done.stderr


def test_cli_explicit_mode_with_tokens_and_an_unauthenticated_exposure(
    repo: Path, tmp_path: Path, token_file: Path
) -> None:
    args = (
        "--no-jobs",
        "--model-control-mode",
        "explicit",
        "--load-model",
        "add",
        "--auth-token-file",
        str(token_file),
        "--host",
        "0.0.0.0",
    )
    with ServeProcess(repo, tmp_path, *args) as proc:
        proc.wait_ready()  # health is open without a token
        assert "model control mode explicit; authentication 3 bearer token(s); TLS off" in proc.lines
        assert proc.wait_stderr("in clear text")
        base = f"http://127.0.0.1:{proc.ports['HTTP']}"
        index = httpx.post(base + "/v2/repository/index", headers=_bearer("infer"), trust_env=False).json()
        assert {e["name"]: e["state"] for e in index} == {"add": "READY", "half": "UNAVAILABLE"}
        assert httpx.post(base + "/v2/repository/index", trust_env=False).status_code == 401
        assert (
            httpx.post(base + "/v2/repository/models/half/load", headers=_bearer("admin"), trust_env=False).status_code
            == 200
        )
        assert proc.stop() == 0
    with ServeProcess(repo, tmp_path, "--no-jobs", "--host", "0.0.0.0", "--allow-unauthenticated") as proc:
        proc.wait_ready()
        assert proc.wait_stderr("WITHOUT authentication")
        assert proc.stop() == 0
