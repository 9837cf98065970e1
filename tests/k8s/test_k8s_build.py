"""Every overlay builds with kustomize, and every object it renders passes strict schema
validation against the schemas kept in k8s/schemas (CRDs included, no network)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from k8s_tools import K8S, Tools, build, objects, validate

# The first test to run may build the tools (pytest-timeout counts fixture set-up).
pytestmark = pytest.mark.timeout(900)

SUMMARY = re.compile(
    r"Summary: (\d+) resources? found .* Valid: (\d+), Invalid: (\d+), Errors: (\d+),"
    r" Skipped: (\d+)"
)


def _summary(out: str) -> tuple[int, ...]:
    match = SUMMARY.search(out)
    assert match, out
    return tuple(int(g) for g in match.groups())


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_overlay_renders_and_validates(
    overlay: str, tools: Tools, rendered: dict[str, str]
) -> None:
    proc = validate(tools, rendered[overlay])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found, valid, invalid, errors, skipped = _summary(proc.stdout)
    assert (invalid, errors, skipped) == (0, 0, 0)
    assert found == valid == len(objects(rendered[overlay]))


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_overlay_has_every_part(overlay: str, rendered: dict[str, str]) -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in objects(rendered[overlay])}
    for expected in [
        ("Deployment", "shadow-ab-engines"),
        ("StatefulSet", "shadow-ab-mirror"),
        ("Service", "shadow-ab-mirror-pods"),
        ("Deployment", "shadow-ab-health"),
        ("Deployment", "shadow-ab-ingester"),
        ("Deployment", "shadow-ab-api"),
        ("Service", "shadow-ab-llm"),
        ("Service", "shadow-ab-api"),
        ("CronJob", "shadow-ab-evaluator"),
        ("Job", "shadow-ab-migrate"),
        ("Kafka", "shadow-ab"),
        ("KafkaNodePool", "controller"),
        ("KafkaNodePool", "broker"),
        ("KafkaTopic", "shadow.exchanges"),
        ("KafkaTopic", "shadow.health"),
        ("KafkaTopic", "shadow.dlq"),
        ("Cluster", "shadow-ab-pg"),
        ("ScheduledBackup", "shadow-ab-pg-nightly"),
        ("ServiceMonitor", "shadow-ab-mirror"),
        ("PodMonitor", "shadow-ab-workers"),
        ("PrometheusRule", "shadow-ab"),
        ("NetworkPolicy", "shadow-ab-engines"),
        ("NetworkPolicy", "shadow-ab-postgres"),
    ]:
        assert expected in kinds, expected


def test_gpu_sharing_config_validates(tools: Tools) -> None:
    proc = validate(tools, build(tools, K8S / "gpu"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _summary(proc.stdout)[0] == 1


def test_bypass_component_validates_and_flips_the_selector(tools: Tools, tmp_path: Path) -> None:
    # An overlay in a temporary folder with the component, as a user would add it to theirs.
    # (kustomize wants relative paths.)
    overlay = os.path.relpath(K8S / "overlays" / "dev", tmp_path)
    component = os.path.relpath(K8S / "components" / "bypass-mirror", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {overlay}\ncomponents:\n  - {component}\n"
    )
    text = build(tools, tmp_path)
    proc = validate(tools, text)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    docs = objects(text)
    llm = next(
        d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "shadow-ab-llm"
    )
    assert llm["spec"]["selector"]["app.kubernetes.io/component"] == "engines"
    names = {d["metadata"]["name"] for d in docs if d["kind"] == "NetworkPolicy"}
    assert "shadow-ab-engines-clients" in names


BAD_FIELD = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: x}
spec:
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      containers:
        - name: c
          image: i:1
          resource: {requests: {cpu: "1"}}
"""

BAD_CRD_FIELD = """\
apiVersion: kafka.strimzi.io/v1
kind: KafkaTopic
metadata: {name: t}
spec: {partitions: 3, replicas: 3, retention: 1d}
"""

NO_SCHEMA = """\
apiVersion: v1
kind: Secret
metadata: {name: s}
stringData: {password: hunter2}
"""


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        (BAD_FIELD, "'resource' not allowed"),
        (BAD_CRD_FIELD, "'retention' not allowed"),
        (NO_SCHEMA, "could not find schema for Secret"),
    ],
)
def test_validation_rejects_unknown_fields_and_kinds_without_schema(
    manifest: str, message: str, tools: Tools
) -> None:
    proc = validate(tools, manifest)
    assert proc.returncode != 0
    assert message in proc.stdout, proc.stdout
