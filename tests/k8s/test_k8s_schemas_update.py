"""The schema converter (k8s/schemas/update.py) on plain values: what makes the CRD schemas
strict, and how core references are pointed at the local definitions file."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
from k8s_tools import SCHEMAS


@pytest.fixture(scope="module")
def update() -> ModuleType:
    spec = importlib.util.spec_from_file_location("schemas_update", SCHEMAS / "update.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_crd_nodes_become_strict_json_schema(update: ModuleType) -> None:
    node = {
        "type": "object",
        "description": "dropped",
        "properties": {
            "port": {"x-kubernetes-int-or-string": True, "type": "string"},
            "note": {"type": "string", "nullable": True},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "map": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    }
    out = update._crd_node(node)
    assert out["additionalProperties"] is False
    assert "description" not in out
    props = out["properties"]
    assert props["port"] == {"oneOf": [{"type": "string"}, {"type": "integer"}]}
    assert props["note"]["type"] == ["string", "null"]
    assert "additionalProperties" not in props["free"]
    assert props["map"]["additionalProperties"] == {"type": "string"}


def test_crd_schema_pins_api_version_and_kind(update: ModuleType, tmp_path: Path) -> None:
    crd = tmp_path / "crd.yaml"
    crd.write_text(
        "spec:\n  group: kafka.strimzi.io\n  names: {kind: KafkaTopic}\n  versions:\n"
        "    - name: v1\n      schema:\n        openAPIV3Schema:\n          type: object\n"
        "          properties: {spec: {type: object, properties: {partitions: {type: integer}}}}\n"
    )
    name, schema = update.crd_schema(crd, "v1")
    assert name == "kafkatopic-kafka-v1"
    assert schema["properties"]["apiVersion"]["enum"] == ["kafka.strimzi.io/v1"]
    assert schema["properties"]["spec"]["additionalProperties"] is False


def test_core_refs_point_at_the_local_definitions(update: ModuleType) -> None:
    node = {"$ref": "/api/_definitions.json#/$defs/io.k8s.api.core.v1.PodSpec", "$id": "x"}
    assert update._strip(node, "_definitions.json#/$defs/") == {
        "$ref": "_definitions.json#/$defs/io.k8s.api.core.v1.PodSpec"
    }


def test_committed_schemas_resolve_locally() -> None:
    files = {p.name for p in SCHEMAS.glob("*.json")}
    defs = json.loads((SCHEMAS / "_definitions.json").read_text())["$defs"]
    for path in SCHEMAS.glob("*.json"):
        text = path.read_text()
        assert "https://" not in text.replace("https://json-schema.org/", ""), path.name
        for ref in json.loads(text).get("properties", {}).values():
            target = ref.get("$ref", "") if isinstance(ref, dict) else ""
            if target.startswith("_definitions.json#/$defs/"):
                assert target.rsplit("/", 1)[-1] in defs
    assert "deployment-apps-v1.json" in files and "cluster-postgresql-v1.json" in files
    total = sum(p.stat().st_size for p in SCHEMAS.glob("*.json"))
    assert total < 2 * 1024 * 1024
