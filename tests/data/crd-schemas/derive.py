"""Derive the JSON Schemas in this folder from the published CRDs (run by hand; the tests only read the JSON).

    python tests/data/crd-schemas/derive.py KEDA_REPO KSERVE_REPO

``KEDA_REPO`` is a checkout (or a bare clone) of kedacore/keda (``config/crd/bases/keda.sh_*.yaml``),
``KSERVE_REPO`` one of kserve/kserve (``config/crd/full/serving.kserve.io_*.yaml``). Each CRD version's
``openAPIV3Schema`` is turned into a JSON Schema (draft 2020-12) that keeps its types, required
fields, enums and bounds, and then:

- drops ``description`` and the ``x-kubernetes-*`` markers (CEL rules in
  ``x-kubernetes-validations`` are not checked here), turns OpenAPI's ``nullable`` into a
  ``"null"`` type;
- closes every object that lists ``properties`` (``additionalProperties: false``) unless the CRD
  keeps unknown fields: the API server's strict field validation (kubectl's default since 1.27)
  rejects an unknown field where the schema would otherwise prune it silently;
- pins ``apiVersion`` and ``kind``, requires ``metadata`` and ``spec``, refuses ``status``;
- replaces the embedded core Kubernetes types named in :data:`STUBS` (a Job spec, containers,
  volumes, affinity, ...) by their type alone: tests/e2e/test_deploy_manifests.py checks those
  parts with ``kubernetes-validate --strict`` inside a built-in kind instead;
- adds the enums the Go types declare but the CRD does not (:data:`TIGHTEN`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent

_CORE_POD = [
    "affinity",
    "containers[]",
    "initContainers[]",
    "volumes[]",
    "tolerations[]",
    "imagePullSecrets[]",
    "resourceClaims[]",
    "topologySpreadConstraints[]",
    "securityContext",
    "dnsConfig",
    "hostAliases[]",
    "os",
    "overhead",
    "readinessGates[]",
    "schedulingGates[]",
    "workerSpec",
    "resources",
]
_CORE_CONTAINER = [
    "env[]",
    "envFrom[]",
    "lifecycle",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "ports[]",
    "resources",
    "securityContext",
    "volumeMounts[]",
    "volumeDevices[]",
    "resizePolicy[]",
    "restartPolicyRules[]",
]
_FRAMEWORKS = [
    "sklearn",
    "xgboost",
    "tensorflow",
    "pytorch",
    "triton",
    "onnx",
    "pmml",
    "lightgbm",
    "paddle",
    "huggingface",
]

STUBS: dict[str, list[str]] = {
    "ScaledJob": ["spec.jobTargetRef.template"],
    "ServingRuntime": [f"spec.{p}" for p in _CORE_POD],
    "ClusterServingRuntime": [f"spec.{p}" for p in _CORE_POD],
    "InferenceService": (
        ["spec.explainer", "spec.transformer", "spec.canary"]
        + [f"spec.predictor.{p}" for p in _CORE_POD + _FRAMEWORKS]
        + [f"spec.predictor.model.{p}" for p in _CORE_CONTAINER]
    ),
}
"""Per kind, the paths (``[]`` = the items of an array) whose core-type subtree is replaced by its type."""

_PROTOCOLS = ["v1", "v2", "grpc-v1", "grpc-v2"]  # kserve pkg/constants/constants.go, InferenceServiceProtocol
TIGHTEN: dict[str, dict[str, dict[str, Any]]] = {
    "ServingRuntime": {"spec.protocolVersions[]": {"enum": _PROTOCOLS}},
    "ClusterServingRuntime": {"spec.protocolVersions[]": {"enum": _PROTOCOLS}},
    "InferenceService": {"spec.predictor.model.protocolVersion": {"enum": _PROTOCOLS}},
}

CRDS = {
    "keda": [
        ("config/crd/bases/keda.sh_scaledobjects.yaml", "v1alpha1"),
        ("config/crd/bases/keda.sh_scaledjobs.yaml", "v1alpha1"),
        ("config/crd/bases/keda.sh_triggerauthentications.yaml", "v1alpha1"),
    ],
    "kserve": [
        ("config/crd/full/serving.kserve.io_servingruntimes.yaml", "v1alpha1"),
        ("config/crd/full/serving.kserve.io_clusterservingruntimes.yaml", "v1alpha1"),
        ("config/crd/full/serving.kserve.io_inferenceservices.yaml", "v1beta1"),
    ],
}


def convert(s: Any) -> Any:
    """One OpenAPI v3 (structural CRD) schema node → JSON Schema 2020-12, objects closed."""
    if isinstance(s, list):
        return [convert(v) for v in s]
    if not isinstance(s, dict):
        return s
    out: dict[str, Any] = {}
    for k, v in s.items():
        if k in ("description", "default", "example") or k.startswith("x-kubernetes-"):
            continue
        if k in ("properties", "patternProperties"):
            out[k] = {name: convert(sub) for name, sub in v.items()}
        elif k in ("items", "additionalProperties", "not") or k in ("anyOf", "allOf", "oneOf"):
            out[k] = convert(v)
        elif k in ("exclusiveMinimum", "exclusiveMaximum") and isinstance(v, bool):
            bound = "minimum" if k == "exclusiveMinimum" else "maximum"
            if v and bound in s:
                out[k] = s[bound]
        elif k == "nullable":
            continue
        else:
            out[k] = v
    if s.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if "properties" in out and "additionalProperties" not in out and not s.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    if "exclusiveMinimum" in out and isinstance(out["exclusiveMinimum"], (int, float)):
        out.pop("minimum", None)
    if "exclusiveMaximum" in out and isinstance(out["exclusiveMaximum"], (int, float)):
        out.pop("maximum", None)
    return out


def _node(schema: dict[str, Any], path: str) -> tuple[dict[str, Any], str]:
    """The parent node and the last key of ``path`` (``a.b[]`` → ``a``'s ``b``'s items)."""
    parts = path.split(".")
    node = schema
    for part in parts[:-1]:
        name = part.removesuffix("[]")
        node = node["properties"][name]
        if part.endswith("[]"):
            node = node["items"]
    return node, parts[-1]


def _target(schema: dict[str, Any], path: str) -> dict[str, Any] | None:
    node, last = _node(schema, path)
    sub = node.get("properties", {}).get(last.removesuffix("[]"))
    if sub is None:
        return None
    return sub["items"] if last.endswith("[]") else sub


def stub(schema: dict[str, Any], path: str, note: str) -> None:
    """Replace the subtree at ``path`` by its type (and required fields), with a note saying why."""
    node, last = _node(schema, path)
    name = last.removesuffix("[]")
    if name not in node.get("properties", {}):
        return  # a field this CRD version does not have
    holder = node["properties"][name]
    key = "items" if last.endswith("[]") else None
    old = holder[key] if key else holder
    new: dict[str, Any] = {"type": old.get("type", "object"), "$comment": note}
    if old.get("required"):
        new["required"] = old["required"]
    if key:
        holder[key] = new
    else:
        node["properties"][name] = new


def _read(repo: Path, rel: str) -> str:
    """A file of a checkout, or of HEAD in a bare clone."""
    if (repo / rel).exists():
        return (repo / rel).read_text()
    return subprocess.run(
        ["git", "--git-dir", str(repo), "show", f"HEAD:{rel}"], capture_output=True, text=True, check=True
    ).stdout


def derive(crd_text: str, crd_name: str, version: str, source: str) -> tuple[str, dict[str, Any]]:
    """The schema file name and JSON Schema of one CRD version."""
    crd = yaml.safe_load(crd_text)
    kind = crd["spec"]["names"]["kind"]
    group = crd["spec"]["group"]
    (ver,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = convert(ver["schema"]["openAPIV3Schema"])
    schema["properties"]["apiVersion"] = {"const": f"{group}/{version}"}
    schema["properties"]["kind"] = {"const": kind}
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata", "spec"})
    schema["properties"].pop("status", None)  # written by the controllers, never by a manifest
    for path in STUBS.get(kind, []):
        stub(schema, path, "a core Kubernetes type: checked with kubernetes-validate --strict in a built-in kind")
    for path, extra in TIGHTEN.get(kind, {}).items():
        target = _target(schema, path)
        if target is not None:
            target.update(extra)
    doc = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$comment": f"Derived by derive.py from {source} ({crd_name}, CRD version {version}); "
        "descriptions dropped, objects closed, embedded core types stubbed.",
        "title": f"{kind} {group}/{version}",
        **schema,
    }
    return f"{kind.lower()}.{group}.{version}.json", doc


def _describe(repo: Path) -> str:
    git = ["git", "--git-dir", str(repo)] if (repo / "objects").is_dir() else ["git", "-C", str(repo)]
    out = subprocess.run([*git, "describe", "--tags"], capture_output=True, text=True)
    rev = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    return f"{out.stdout.strip() or '?'} ({rev.stdout.strip()[:12] or '?'})"


def main(argv: list[str]) -> None:
    keda, kserve = map(Path, argv)
    for name, repo in (("keda", keda), ("kserve", kserve)):
        source = f"{'kedacore/keda' if name == 'keda' else 'kserve/kserve'} {_describe(repo)}"
        for rel, version in CRDS[name]:
            fname, doc = derive(_read(repo, rel), Path(rel).name, version, source)
            (HERE / fname).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
            print(fname)


if __name__ == "__main__":
    main(sys.argv[1:])
