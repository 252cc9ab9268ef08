"""deploy/k8s checked without a cluster.

Every kustomization is rendered with ``kubectl kustomize`` (offline); every built-in kind is
validated with ``kubernetes-validate --strict`` against Kubernetes :data:`K8S_VERSION`; every KEDA
and KServe kind against the JSON Schema derived from its published CRD (tests/data/crd-schemas,
``derive.py`` says how), with the core Kubernetes parts those CRDs embed (a Job spec, containers)
validated strictly inside a built-in kind. Each schema is shown to reject a broken manifest. The
KEDA ``postgresql`` triggers' queries run on a real PostgreSQL holding jobs made through the
JobStore, and every container's args are parsed by the real CLI.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import typer
import yaml
from _pg import PgServer, pg_server  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
SCHEMAS = ROOT / "tests" / "data" / "crd-schemas"
KUSTOMIZATIONS = ("overlays/scaledjob", "overlays/scaledobject", "overlays/kserve", "secrets-example")
"""What a platform engineer applies (deploy/README.md); ``base`` and the components are parts of them."""
K8S_VERSION = "1.32.0"
"""kubectl on this machine kind is v1.32; kubernetes-validate ships the schemas of that release."""
IMAGE = "registry.example.invalid/frameserve"
CUSTOM = {
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject.keda.sh.v1alpha1.json",
    ("keda.sh/v1alpha1", "ScaledJob"): "scaledjob.keda.sh.v1alpha1.json",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "triggerauthentication.keda.sh.v1alpha1.json",
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "servingruntime.serving.kserve.io.v1alpha1.json",
    ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): "clusterservingruntime.serving.kserve.io.v1alpha1.json",
    ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservice.serving.kserve.io.v1beta1.json",
}


# ----------------------------------------------------------------------------- rendering


def _kubectl() -> str:
    exe = shutil.which("kubectl")
    if exe is None:
        pytest.skip(
            "kubectl is not on PATH (this machine kind has kubectl v1.32 with kustomize built in): "
            "the manifests cannot be rendered here"
        )
    return exe


@functools.cache
def _render(rel: str) -> tuple[dict[str, Any], ...]:
    out = subprocess.run([_kubectl(), "kustomize", str(K8S / rel)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"kubectl kustomize {rel} failed:\n{out.stderr}"
    docs = tuple(d for d in yaml.safe_load_all(out.stdout) if d)
    assert docs, f"{rel} renders nothing"
    return docs


def render(rel: str) -> list[dict[str, Any]]:
    """The documents ``kubectl kustomize deploy/k8s/<rel>`` prints (a deep copy: tests may edit them)."""
    return copy.deepcopy(list(_render(rel)))


def all_docs() -> Iterator[tuple[str, dict[str, Any]]]:
    for rel in KUSTOMIZATIONS:
        for doc in render(rel):
            yield rel, doc


def one(rel: str, kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in render(rel) if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{rel}: {len(found)} {kind} {name or ''}"
    return found[0]


def is_custom(doc: dict[str, Any]) -> bool:
    return doc["apiVersion"].split("/")[0].endswith((".keda.sh", ".kserve.io")) or doc["apiVersion"].startswith(
        "keda.sh/"
    )


@functools.cache
def _schema(name: str) -> dict[str, Any]:
    schema = json.loads((SCHEMAS / name).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def crd_errors(doc: dict[str, Any]) -> list[str]:
    """Every violation of ``doc``'s CRD schema (a doc of an unknown custom kind is one)."""
    key = (doc["apiVersion"], doc["kind"])
    if key not in CUSTOM:
        return [f"no CRD schema for {key}"]
    validator = jsonschema.Draft202012Validator(_schema(CUSTOM[key]))
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def k8s_errors(doc: dict[str, Any]) -> str | None:
    """``kubernetes-validate --strict``'s complaint about a built-in-kind document, or ``None``."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return f"{doc['kind']} {doc['metadata'].get('name')}: {exc.message} at {'/'.join(map(str, exc.path))}"
    return None


def core_parts(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The core Kubernetes parts a custom kind embeds, each wrapped in a built-in kind for
    kubernetes-validate (the CRD schemas stub them): its metadata (as a ConfigMap's), a ScaledJob's
    Job spec, a runtime's containers, an InferenceService's model container."""
    meta = {"name": doc["metadata"]["name"], **{k: v for k, v in doc["metadata"].items() if k != "name"}}
    parts = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}]
    spec = doc.get("spec", {})
    if doc["kind"] == "ScaledJob":
        parts.append(
            {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": meta["name"]}, "spec": spec["jobTargetRef"]}
        )
    if doc["kind"] in ("ServingRuntime", "ClusterServingRuntime"):
        pod_keys = ("containers", "volumes", "affinity", "tolerations", "imagePullSecrets", "nodeSelector")
        parts.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": meta["name"]},
                "spec": {k: spec[k] for k in pod_keys if k in spec},
            }
        )
    if doc["kind"] == "InferenceService":
        model = spec["predictor"]["model"]
        container = {
            "name": "kserve-container",
            "image": "placeholder",
            **{
                k: v
                for k, v in model.items()
                if k not in ("modelFormat", "runtime", "runtimeVersion", "protocolVersion", "storageUri", "storage")
            },
        }
        parts.append(
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": meta["name"]}, "spec": {"containers": [container]}}
        )
    return parts


# ----------------------------------------------------------------------------- rendering and schemas


def test_every_kustomization_is_rendered_and_checked() -> None:
    found = {str(p.parent.relative_to(K8S)) for p in K8S.rglob("kustomization.yaml")}
    parts = {"base", "components/image", "components/keda-auth"}
    assert found == set(KUSTOMIZATIONS) | parts, "a new kustomization must be added to KUSTOMIZATIONS"
    for rel in KUSTOMIZATIONS:
        kinds = [d["kind"] for d in render(rel)]
        assert len(kinds) >= 2, (rel, kinds)
        for doc in render(rel):
            for c in _containers(doc):
                assert c["image"].startswith(IMAGE + ":"), f"{rel}: {doc['kind']} runs {c['image']}"


def test_builtin_kinds_validate_strictly() -> None:
    checked = set()
    errors = []
    for rel, doc in all_docs():
        for part in core_parts(doc) if is_custom(doc) else [doc]:
            checked.add(part["kind"])
            if (err := k8s_errors(part)) is not None:
                errors.append(f"{rel}: {err}")
    assert not errors, "\n".join(errors)
    assert {
        "Deployment",
        "Service",
        "ConfigMap",
        "Secret",
        "Namespace",
        "PersistentVolumeClaim",
        "Job",
        "Pod",
    } <= checked


def test_strict_validation_rejects_an_unknown_field() -> None:
    deployment = one("overlays/scaledjob", "Deployment", "frameserve-server")
    assert k8s_errors(deployment) is None
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}  # a typo
    assert "livenesProbe" in (k8s_errors(deployment) or "")


def test_custom_kinds_match_their_crd_schemas() -> None:
    seen = set()
    errors = []
    for rel, doc in all_docs():
        if is_custom(doc):
            seen.add(doc["kind"])
            errors += [f"{rel}: {doc['kind']} {doc['metadata']['name']}: {e}" for e in crd_errors(doc)]
    assert not errors, "\n".join(errors)
    assert seen == {"ScaledObject", "ScaledJob", "TriggerAuthentication", "ClusterServingRuntime", "InferenceService"}


def _servingruntime() -> dict[str, Any]:
    """The namespaced twin of the ClusterServingRuntime (the same spec under the other CRD)."""
    doc = one("overlays/kserve", "ClusterServingRuntime")
    doc["kind"] = "ServingRuntime"
    doc["metadata"]["namespace"] = "frameserve"
    return doc


def _break(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``doc`` with ``path`` (``a.b.0.c``; a trailing ``-`` deletes) set to ``value``."""
    broken = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node: Any = broken
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value == "-":
        del node[last]
    else:
        node[int(last) if isinstance(node, list) else last] = value
    return broken


BROKEN = {
    "ScaledJob": [
        ("spec.triggers", "-"),
        ("spec.scalingStrategy.strategy", "fastest"),
        ("spec.maxReplicaCount", "20"),
        ("spec.triggers.0.metadata.targetQueryValue", 1),
        ("spec.pollingIntervall", 10),
        ("spec.jobTargetRef.template", "-"),
    ],
    "ScaledObject": [
        ("spec.scaleTargetRef", "-"),
        ("spec.fallback.behavior", "sometimes"),
        ("spec.fallback.replicas", "-"),
        ("spec.triggers.1.metadata.desiredReplicas", 4),
        ("spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleDown.policies.0.value", "one"),
        ("spec.cooldownperiod", 300),
    ],
    "TriggerAuthentication": [
        ("spec.secretTargetRef.0.key", "-"),
        ("spec.secretTargetRef.0.parameter", 5),
        ("spec.secretTargetRefs", []),
    ],
    "ClusterServingRuntime": [
        ("spec.containers", "-"),
        ("spec.protocolVersions.0", "v3"),
        ("spec.supportedModelFormats.0.autoSelect", "yes"),
        ("spec.supportedModelFormats.0.priority", 0),
        ("spec.supportedModelFormat", []),
    ],
    "ServingRuntime": [
        ("spec.containers", "-"),
        ("spec.protocolVersions.1", "grpc-v3"),
        ("spec.supportedModelFormats.0.name", "-"),
    ],
    "InferenceService": [
        ("spec.predictor", "-"),
        ("spec.predictor.model.protocolVersion", "v9"),
        ("spec.predictor.model.modelFormat.name", "-"),
        ("spec.predictor.minReplicas", "one"),
        ("spec.predictor.model.storageURI", "s3://x"),
        ("status", {"ready": True}),
    ],
}
"""Per custom kind, breakages its schema must refuse: a required field gone, an enum, a type, an
unknown (mistyped) field, a bound."""


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_each_crd_schema_rejects_a_broken_manifest(kind: str) -> None:
    if kind == "ServingRuntime":
        doc = _servingruntime()
    else:
        rel = {
            "ScaledJob": "overlays/scaledjob",
            "ScaledObject": "overlays/scaledobject",
            "TriggerAuthentication": "overlays/scaledjob",
        }.get(kind, "overlays/kserve")
        doc = one(rel, kind)
    assert crd_errors(doc) == []
    for path, value in BROKEN[kind]:
        assert crd_errors(_break(doc, path, value)), f"{kind}: the schema accepts {path} = {value!r}"
    assert crd_errors({**doc, "apiVersion": doc["apiVersion"].replace("v1", "v2")})


# ----------------------------------------------------------------------------- what the manifests say


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {})
    if doc["kind"] == "Deployment":
        return spec["template"]["spec"]["containers"]
    if doc["kind"] == "ScaledJob":
        return spec["jobTargetRef"]["template"]["spec"]["containers"]
    if doc["kind"] in ("ServingRuntime", "ClusterServingRuntime"):
        return spec["containers"]
    return []


def _arg(args: list[str], flag: str) -> str:
    assert flag in args, f"{flag} not in {args}"
    return args[args.index(flag) + 1]


def _probe_path(container: dict[str, Any], probe: str) -> tuple[str, str]:
    get = container[probe]["httpGet"]
    return get["path"], get["port"]


def _check_scrape(pod: dict[str, Any], args: list[str]) -> None:
    """Prometheus' annotations name the metrics port the container serves on a reachable address."""
    ann = pod["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/path"] == "/metrics"
    assert ann["prometheus.io/port"] == _arg(args, "--metrics-port")
    address = _arg(args, "--metrics-address") if "--metrics-address" in args else _arg(args, "--host")
    assert address == "0.0.0.0", f"metrics bind {address}: Prometheus cannot reach them"


def test_server_deployment_and_service() -> None:
    dep = one("overlays/scaledjob", "Deployment", "frameserve-server")
    pod = dep["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    args = c["args"]
    assert args[0] == "serve" and "--no-embedded-worker" in args
    assert _arg(args, "--host") == "0.0.0.0" and _arg(args, "--model-control-mode") == "none"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert [int(_arg(args, f)) for f in ("--http-port", "--grpc-port", "--metrics-port")] == [8000, 8001, 8002]
    assert _probe_path(c, "livenessProbe") == ("/v2/health/live", "http")
    assert _probe_path(c, "readinessProbe") == _probe_path(c, "startupProbe") == ("/v2/health/ready", "http")
    _check_scrape(pod, args)
    # the thread plan: --threads per instance x 1 instance = the pod's whole CPU budget
    res = c["resources"]
    assert res["requests"]["cpu"] == res["limits"]["cpu"] == _arg(args, "--threads")
    # tokens from a Secret mounted where --auth-token-file points
    token_dir = str(Path(_arg(args, "--auth-token-file")).parent)
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == token_dir]
    (vol,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    secrets = {d["metadata"]["name"]: d for d in render("secrets-example") if d["kind"] == "Secret"}
    assert Path(_arg(args, "--auth-token-file")).name in secrets[vol["secret"]["secretName"]]["stringData"]
    # --db through its environment variable, from the Secret KEDA reads too
    db_env = {e["name"]: e for e in c["env"]}["FRAMESERVE_DB"]["valueFrom"]["secretKeyRef"]
    assert db_env["key"] in secrets[db_env["name"]]["stringData"]
    svc = one("overlays/scaledjob", "Service", "frameserve")
    assert {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]} == {
        "http": (8000, "http"),
        "grpc": (8001, "grpc"),
        "metrics": (8002, "metrics"),
    }
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()


def test_keda_workers() -> None:
    import frameserve.jobs.queue as queue

    secrets = {d["metadata"]["name"]: d for d in render("secrets-example") if d["kind"] == "Secret"}
    for rel, kind in (("overlays/scaledjob", "ScaledJob"), ("overlays/scaledobject", "ScaledObject")):
        scaled = one(rel, kind)
        auth = one(rel, "TriggerAuthentication")
        triggers = {t["type"]: t for t in scaled["spec"]["triggers"]}
        pg = triggers["postgresql"]
        assert pg["authenticationRef"]["name"] == auth["metadata"]["name"]
        (ref,) = auth["spec"]["secretTargetRef"]
        assert ref["parameter"] == "connection" and ref["key"] in secrets[ref["name"]]["stringData"]
        assert float(pg["metadata"]["targetQueryValue"]) > 0 and "activationTargetQueryValue" in pg["metadata"]
        expected = queue.SCALED_JOB_QUERY if kind == "ScaledJob" else queue.SCALED_OBJECT_QUERY
        assert pg["metadata"]["query"] == expected
    job = one("overlays/scaledjob", "ScaledJob")
    assert job["spec"]["scalingStrategy"]["strategy"] == "accurate"  # the query leaves running jobs out
    template = job["spec"]["jobTargetRef"]["template"]["spec"]
    (c,) = template["containers"]
    assert c["args"][0] == "worker" and _arg(c["args"], "--max-jobs") == "1"
    _check_scrape(job["spec"]["jobTargetRef"]["template"], c["args"])
    grace_s = float(_arg(c["args"], "--grace-s"))
    assert grace_s < template["terminationGracePeriodSeconds"] <= grace_s + 30
    so = one("overlays/scaledobject", "ScaledObject")
    spec = so["spec"]
    target = one("overlays/scaledobject", "Deployment", spec["scaleTargetRef"]["name"])
    assert "replicas" not in target["spec"]  # KEDA's HPA owns it
    pod = target["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["args"][0] == "worker" and "--max-jobs" not in c["args"]
    _check_scrape(target["spec"]["template"], c["args"])
    grace_s = float(_arg(c["args"], "--grace-s"))
    assert grace_s < pod["terminationGracePeriodSeconds"] <= grace_s + 30
    assert spec["fallback"]["failureThreshold"] > 0 and spec["fallback"]["replicas"] > 0
    down = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert down["stabilizationWindowSeconds"] > 0 and down["policies"]
    cron = {t["type"]: t for t in spec["triggers"]}["cron"]["metadata"]
    assert {"timezone", "start", "end", "desiredReplicas"} <= cron.keys() and cron["start"] != cron["end"]
    assert 0 < int(cron["desiredReplicas"]) <= spec["maxReplicaCount"]


def test_kserve_runtime_and_inference_service() -> None:
    rt = one("overlays/kserve", "ClusterServingRuntime")
    assert "namespace" not in rt["metadata"]  # cluster-scoped
    spec = rt["spec"]
    assert spec["protocolVersions"] == ["v2", "grpc-v2"]
    formats = {f["name"]: f for f in spec["supportedModelFormats"]}
    assert {"onnx", "openvino", "triton"} <= formats.keys() and all(f["autoSelect"] for f in formats.values())
    (c,) = spec["containers"]
    args = c["args"]
    assert c["name"] == "kserve-container" and args[0] == "serve"
    assert (_arg(args, "--http-port"), _arg(args, "--grpc-port")) == ("8080", "9000")
    assert _arg(args, "--model-repository") == "/mnt/models" and _arg(args, "--host") == "0.0.0.0"
    assert "--allow-unauthenticated" in args
    assert spec["annotations"]["prometheus.kserve.io/port"] == _arg(args, "--metrics-port")
    assert spec["annotations"]["prometheus.kserve.io/path"] == "/metrics"
    isvc = one("overlays/kserve", "InferenceService")
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == rt["metadata"]["name"] and model["modelFormat"]["name"] in formats
    assert model["protocolVersion"] in spec["protocolVersions"]


# ----------------------------------------------------------------------------- the real CLI


@functools.cache
def _cli() -> Any:
    """The click group of ``frameserve serve`` and ``worker``, as the console script builds it."""
    from frameserve.cli import serve, worker

    app = typer.Typer()
    serve.register(app)
    worker.register(app)
    return typer.main.get_command(app)


def _click() -> Any:
    """The click package behind typer's commands (typer 0.2x vendors its own as ``typer._click``)."""
    import importlib

    base = next(c for c in type(_cli()).__mro__ if c.__name__ == "Command")
    return importlib.import_module(base.__module__.rsplit(".", 1)[0])


@functools.cache
def _help(command: str) -> str:
    exe = Path(sys.executable).with_name("frameserve")
    base = [str(exe)] if exe.exists() else [sys.executable, "-m", "frameserve"]
    out = subprocess.run(
        [*base, command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "250", "PATH": "/usr/bin:/bin", "TERM": "dumb"},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_every_container_args_are_accepted_by_the_cli() -> None:
    checked = 0
    for rel, doc in all_docs():
        for c in _containers(doc):
            command, *args = c["args"]
            cmd = _cli().commands[command]
            try:  # parses and checks every value as `frameserve <command> ...` would, runs nothing
                cmd.make_context(command, list(args))
            except _click().ClickException as exc:
                pytest.fail(
                    f"{rel} {doc['kind']} {doc['metadata']['name']}: frameserve {command} refuses "
                    f"{args}: {exc.format_message()}"
                )
            listed = set(re.findall(r"--[a-z0-9][a-z0-9-]*", _help(command)))
            unlisted = sorted({a for a in args if a.startswith("--")} - listed)
            assert not unlisted, f"{rel}: `frameserve {command} --help` does not list {unlisted}"
            checked += 1
    assert checked >= 4
    # and the image's default command
    cmd_line = [ln for ln in (ROOT / "deploy" / "Containerfile").read_text().splitlines() if ln.startswith("CMD ")]
    command, *args = json.loads(cmd_line[-1].removeprefix("CMD "))
    _cli().commands[command].make_context(command, list(args))
    with pytest.raises(_click().ClickException):  # and the check can fail
        _cli().commands["worker"].make_context("worker", ["--max-jobz", "1"])


def test_placeholder_secrets_are_refused_at_start() -> None:
    from frameserve.errors import InvalidInputError
    from frameserve.security import TokenTable

    secrets = {d["metadata"]["name"]: d["stringData"] for d in render("secrets-example") if d["kind"] == "Secret"}
    with pytest.raises(InvalidInputError, match="characters"):
        TokenTable.parse(secrets["frameserve-tokens"]["tokens.txt"])
    for values in secrets.values():
        assert all("CHANGE-ME" in v for v in values.values())


# ----------------------------------------------------------------------------- the queries on PostgreSQL


def test_trigger_queries_count_pending_jobs_on_postgresql(pg_server: PgServer) -> None:  # noqa: F811
    import psycopg

    from frameserve.jobs.store import JobSpec, JobStore, RetryPolicy

    queries = {
        "ScaledJob": {t["type"]: t for t in one("overlays/scaledjob", "ScaledJob")["spec"]["triggers"]},
        "ScaledObject": {t["type"]: t for t in one("overlays/scaledobject", "ScaledObject")["spec"]["triggers"]},
    }
    name = pg_server.create_database()
    # a retry waits an hour: its job is queued but not due
    store = JobStore(pg_server.url(name), retry=RetryPolicy(base_s=3600.0, max_s=3600.0, jitter=0.0))
    try:

        def submit(n: int) -> list[str]:
            return [
                store.submit(JobSpec(source="s3://b/in.mp4", target="s3://b/out", pipeline="nudenet"))[0].id
                for _ in range(n)
            ]

        def value(kind: str) -> float:
            # as KEDA's scaler does: the trigger's query on a connection of its own, one number scanned
            with psycopg.connect(f"host=127.0.0.1 port={pg_server.port} user=postgres dbname={name}") as c:
                (row,) = c.execute(queries[kind]["postgresql"]["metadata"]["query"]).fetchall()
            return float(row[0])

        def active(kind: str) -> bool:
            return value(kind) > float(queries[kind]["postgresql"]["metadata"]["activationTargetQueryValue"])

        assert (value("ScaledJob"), value("ScaledObject")) == (0, 0)
        assert not active("ScaledJob") and not active("ScaledObject")
        submit(7)
        done = store.claim("w-done", lease_s=60)
        assert done is not None
        store.complete(done, {"ok": True})  # succeeded
        failed = store.claim("w-fail", lease_s=60)
        assert failed is not None
        store.fail(failed, {"code": "x", "message": "boom"}, retryable=False)  # failed
        retried = store.claim("w-retry", lease_s=60)
        assert retried is not None
        store.fail(retried, {"code": "x", "message": "later"}, retryable=True)  # queued, due in an hour
        assert store.get(retried.job.id).state == "queued"
        running = [store.claim(f"w-run-{i}", lease_s=60) for i in range(2)]  # running
        assert all(running)
        store.cancel(submit(1)[0])  # cancelled
        # 7 submitted: 1 succeeded, 1 failed, 1 retry not due, 2 running, 2 queued and due
        assert store.counts() == {"queued": 3, "running": 2, "succeeded": 1, "failed": 1, "cancelled": 1}
        assert value("ScaledJob") == 2 == store.pending_count()
        assert value("ScaledObject") == 4 == store.active_count()
        assert active("ScaledJob") and active("ScaledObject")
        for lease in running:
            assert lease is not None
            store.complete(lease, {"ok": True})
        assert (value("ScaledJob"), value("ScaledObject")) == (2, 2)
        for job_id in [j.id for j in store.list_jobs(state="queued")[0]]:
            store.cancel(job_id)
        assert (value("ScaledJob"), value("ScaledObject")) == (0, 0)
        assert not active("ScaledJob") and not active("ScaledObject")
    finally:
        store.close()


def test_readme_applies_what_is_here() -> None:
    readme = (ROOT / "deploy" / "README.md").read_text()
    applied = re.findall(r"kubectl apply -k (deploy/k8s/\S+)", readme)
    assert applied and all((ROOT / p / "kustomization.yaml").exists() for p in applied), applied
    assert {str(Path(p).relative_to("deploy/k8s")) for p in applied} >= {
        "overlays/scaledjob",
        "overlays/scaledobject",
        "overlays/kserve",
    }
