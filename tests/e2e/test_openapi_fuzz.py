"""The job and pipeline routes fuzzed from their own OpenAPI document: `schemathesis` (PyPI) runs
against a real `frameserve serve` (jobs on, a file root), bounded in time, with every check it has
(`--checks all`): no 5xx, every status documented, every response body as its schema says,
schema-valid requests accepted or refused with a documented status, schema-invalid ones refused,
the Allow header of a 405 right; the server answers health and a real job submit/get after, and
logged no traceback. Once without tokens (the implicit owner), once with a token file (a `jobs`
token on every request: 401/403 are documented too).

Schemathesis is randomised on purpose (a new seed each run, printed in its summary; replay a failure
with `st run ... --seed N`); no seed is pinned, the bugs it finds are fixed instead.

One check is told what an API with semantic validation answers: `positive_data_acceptance`
(ST202) expects a schema-valid request to be accepted. `POST /v1/jobs` validates what no schema
can say: that a `file://` source exists under the server's file roots, that an `http(s)` host
resolves to a public address, that `params.pipeline` holds the named pipeline's own parameters
(with values its check accepts), that an Idempotency-Key is not reused with another body
(422 as draft-ietf-httpapi-idempotency-key-header says). Those refusals are the documented 400 and
422 of their error codes (frameserve.errors.STATUS), so for that operation 400 and 422
join the statuses ST202 accepts. `POST /v1/jobs/{id}/retry` honours an Idempotency-Key the same
way (a key that retried one job is a 422 for another: the stateful phase reuses keys across the
jobs it made), so 422 joins its statuses too; every other operation, and every other check, runs
as shipped.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from _models import add_model
from _serving import ServeProcess

TOKEN = "fuzz-jobs-token-0123456789abcdefghijklmnop"  # >= 32 characters (frameserve.security.MIN_TOKEN_CHARS)
OPERATIONS = 8
"""POST and GET /v1/jobs, GET and DELETE /v1/jobs/{id}, POST /v1/jobs/{id}/cancel, POST
/v1/jobs/{id}/retry, GET /v1/jobs/{id}/events, GET /v1/pipelines."""

CONFIG = """\
# POST /v1/jobs refuses schema-valid requests for reasons only the server's state decides (see the
# test module's docstring): its documented 400 and 422 are expected answers of ST202 there.
[generation]
database = "none"

[[operations]]
include-name = "POST /v1/jobs"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "400", "401", "403", "404", "409", "422", "429", "5xx"]

# POST /v1/jobs/{id}/retry: an Idempotency-Key that retried another job is its documented 422
[[operations]]
include-name = "POST /v1/jobs/{job_id}/retry"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx"]
"""


def _hostile(root: Path) -> list[tuple[str, bytes]]:
    """Raw JSON bodies the old code answered with a 500, or accepted though no JSON Schema of the
    fields admits them; each must now be a documented 4xx."""
    ok = {"source": f"file://{root}/in.mp4", "target": f"file://{root}/out"}

    def body(**kw: object) -> bytes:
        return json.dumps({**ok, **kw}).encode()

    deep: object = []
    for _ in range(300):
        deep = [deep]
    not_json = json.dumps({**ok, "pipeline": "enhance"})[:-1].encode()  # the "input" param takes any value
    return [
        ("an integer over 64 bits in params.pipeline", body(params={"pipeline": {"x": 2**70}})),  # orjson: 500
        ("params.pipeline nested 300 levels", body(params={"pipeline": {"x": deep}})),  # orjson: 500
        ("a lone surrogate as a params key", body(params={"pipeline": {"\ud800": 1}})),  # orjson: 500
        ("a source name over NAME_MAX", body(source=f"file://{root}/{'a' * 300}")),  # ENAMETOOLONG: 500
        ("a target name over NAME_MAX", body(target=f"file://{root}/{'a' * 300}/b")),  # ENAMETOOLONG: 500
        ("a callback URL with a broken IPv6 host", body(callback_url="http://[::1")),  # urlsplit: 500
        ("NaN in params.pipeline", not_json + b', "params": {"pipeline": {"input": NaN}}}'),  # was stored
        ("1e400 (inf) in params.pipeline", not_json + b', "params": {"pipeline": {"input": 1e400}}}'),  # was stored
        ("a boolean as the priority", body(priority=True)),  # was read as 1
    ]


def _st() -> list[str]:
    exe = Path(sys.executable).with_name("st")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "schemathesis.cli"]


@pytest.mark.parametrize(("tokens", "max_time_s"), [(False, 30), (True, 20)], ids=["implicit-owner", "token"])
def test_job_routes_survive_schemathesis(tmp_path: Path, tokens: bool, max_time_s: int) -> None:
    home, root = tmp_path / "home", tmp_path / "root"
    root.mkdir()
    (root / "in.mp4").write_bytes(b"not a video")  # exists (submit accepts it); a worker fails it at once
    repo = tmp_path / "models"
    add_model(repo / "add" / "1" / "model.onnx")
    extra = ["--file-root", str(root)]
    headers: dict[str, str] = {}
    if tokens:
        (tmp_path / "tokens").write_text(f"{TOKEN} jobs fuzzer\n")
        extra += ["--auth-token-file", str(tmp_path / "tokens"), "--shared-file-root"]  # one tenant, one folder
        headers = {"Authorization": f"Bearer {TOKEN}"}
    (tmp_path / "schemathesis.toml").write_text(CONFIG)
    with ServeProcess(repo, home, *extra) as server:
        server.wait_ready()
        base = f"http://127.0.0.1:{server.ports['HTTP']}"
        if tokens:  # the gate answers without a token, in the documented shape
            refused = httpx.get(f"{base}/v1/jobs", timeout=10)
            assert refused.status_code == 401 and set(refused.json()) <= {"error", "detail"}, refused.text
        spec = httpx.get(f"{base}/openapi.json", headers=headers, timeout=10)
        assert spec.status_code == 200, spec.text
        doc = spec.json()
        # Give the fuzzer one way in: a source and a target that exist under the file root, as
        # examples (only the test knows the server's folders; the document carries no paths)
        fields = doc["components"]["schemas"]["JobRequest"]["properties"]
        fields["source"]["examples"] = [f"file://{root}/in.mp4"]
        fields["target"]["examples"] = [f"file://{root}/out"]
        (tmp_path / "openapi.json").write_text(json.dumps(doc))
        cmd = [
            *_st(),
            "--config-file",
            str(tmp_path / "schemathesis.toml"),
            "run",
            str(tmp_path / "openapi.json"),
            "--url",
            base,
            "--include-path-regex",
            "^/v1/(jobs|pipelines)",
            "--checks",
            "all",
            "--max-time",
            str(max_time_s),
            "--workers",
            "1",
            "--request-timeout",
            "10",
            "--no-color",
        ]
        for name, value in headers.items():
            cmd += ["-H", f"{name}: {value}"]
        run = subprocess.run(
            cmd, capture_output=True, text=True, timeout=max_time_s + 60, cwd=tmp_path, stdin=subprocess.DEVNULL
        )
        out = run.stdout + run.stderr
        summary = out[out.rfind("SUMMARY") :] if "SUMMARY" in out else out[-3000:]
        print(summary)  # the seed, for `st run ... --seed N`
        assert run.returncode == 0, out[-12000:]
        assert re.search(rf"Tested:\s+{OPERATIONS}\b", out), summary  # every route was reached
        generated = re.search(r"(\d+) generated", out)
        assert generated and int(generated.group(1)) >= 50, summary  # and fuzzed, not skipped

        documented = {int(c) for c in doc["paths"]["/v1/jobs"]["post"]["responses"]}
        for what, raw in _hostile(root):
            r = httpx.post(
                f"{base}/v1/jobs", content=raw, headers={**headers, "Content-Type": "application/json"}, timeout=10
            )
            assert 400 <= r.status_code < 500 and r.status_code in documented, (what, r.status_code, r.text[:500])
            assert set(r.json()) <= {"error", "detail"} and r.json()["error"], (what, r.text[:500])

        assert server.proc.poll() is None, server.stderr[-4000:]
        assert httpx.get(f"{base}/v2/health/ready", timeout=10).status_code == 200
        body = {"source": f"file://{root}/in.mp4", "target": f"file://{root}/out", "pipeline": "nudenet"}
        made = httpx.post(f"{base}/v1/jobs", json=body, headers=headers, timeout=10)
        assert made.status_code == 201, made.text
        got = httpx.get(f"{base}/v1/jobs/{made.json()['id']}", headers=headers, timeout=10)
        assert got.status_code == 200 and got.json()["id"] == made.json()["id"], got.text
        assert "Traceback (most recent call last)" not in server.stderr, server.stderr[-6000:]
