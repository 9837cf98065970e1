"""Private text at rest and in flight in the rendered overlays (issue 14, finding 10): Kafka only
over TLS with SCRAM users limited by ACLs, the project's Kafka clients configured for it (the
variables shadow_ab/kafka_security.py reads), backups encrypted, retention on a schedule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from k8s_tools import find

from shadow_ab.kafka_security import kafka_security

Docs = dict[str, list[dict[str, Any]]]
OVERLAYS = ("dev", "prod")
KAFKA_CLIENTS = {
    "shadow-ab-mirror": "shadow-ab-mirror",
    "shadow-ab-health": "shadow-ab-health-sampler",
    "shadow-ab-ingester": "shadow-ab-ingester",
}
"""Workload name -> its KafkaUser."""


def _workload(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    for kind in ("Deployment", "StatefulSet"):
        try:
            return find(docs, kind, name)
        except KeyError:
            continue
    raise KeyError(name)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kafka_listens_only_with_tls_and_scram(overlay: str, docs: Docs) -> None:
    kafka = find(docs[overlay], "Kafka", "shadow-ab")["spec"]
    listeners = kafka["kafka"]["listeners"]
    assert listeners
    for listener in listeners:
        assert listener["tls"] is True, listener["name"]
        assert listener["authentication"]["type"] == "scram-sha-512", listener["name"]
    assert kafka["kafka"]["authorization"]["type"] == "simple"
    assert "userOperator" in kafka["entityOperator"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_client_has_its_own_user_and_a_working_security_config(
    overlay: str, docs: Docs, tmp_path: Path
) -> None:
    d = docs[overlay]
    users = {doc["metadata"]["name"]: doc for doc in d if doc["kind"] == "KafkaUser"}
    assert set(users) == set(KAFKA_CLIENTS.values())
    ca = tmp_path / "ca.crt"
    ca.write_text("---")
    for workload, user in KAFKA_CLIENTS.items():
        pod = _workload(d, workload)["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env = {e["name"]: e for e in container["env"]}
        secret = env["SHADOW_AB_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert secret == {"name": user, "key": "password"}  # the User Operator's Secret
        assert env["SHADOW_AB_KAFKA_SASL_USERNAME"]["value"] == user
        cafile = env["SHADOW_AB_KAFKA_SSL_CAFILE"]["value"]
        mount = next(v for v in container["volumeMounts"] if cafile.startswith(v["mountPath"]))
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        assert volume["secret"]["secretName"] == "shadow-ab-cluster-ca-cert"
        # what the process makes of these variables
        plain = {k: e.get("value", "from-a-secret") for k, e in env.items()}
        plain["SHADOW_AB_KAFKA_SSL_CAFILE"] = str(ca)
        kwargs = kafka_security(plain)
        assert kwargs["security_protocol"] == "SASL_SSL"
        assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
        assert users[user]["spec"]["authentication"]["type"] == "scram-sha-512"

    def ops(user: str, topic: str) -> set[str]:
        acls = users[user]["spec"]["authorization"]["acls"]
        return {
            op
            for a in acls
            if a["resource"]["type"] == "topic" and a["resource"]["name"] == topic
            for op in a["operations"]
        }

    # least privilege: only the ingester reads, and only it writes dead letters
    assert "Read" not in ops("shadow-ab-mirror", "shadow.exchanges")
    assert "Write" not in ops("shadow-ab-health-sampler", "shadow.exchanges")
    assert ops("shadow-ab-ingester", "shadow.exchanges") == {"Read", "Describe"}
    assert ops("shadow-ab-mirror", "shadow.dlq") == set()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_backups_are_encrypted(overlay: str, docs: Docs) -> None:
    store = find(docs[overlay], "Cluster", "shadow-ab-pg")["spec"]["backup"]["barmanObjectStore"]
    assert store["wal"]["encryption"] in ("AES256", "aws:kms")
    assert store["data"]["encryption"] in ("AES256", "aws:kms")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_retention_runs_on_a_schedule(overlay: str, docs: Docs) -> None:
    d = docs[overlay]
    cron = find(d, "CronJob", "shadow-ab-retention")["spec"]
    assert cron["schedule"] and cron["concurrencyPolicy"] == "Forbid"
    container = cron["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["db", "retention", "--keep-days=$(RETENTION_DAYS)"]
    env = {e["name"]: e for e in container["env"]}
    ref = env["RETENTION_DAYS"]["valueFrom"]["configMapKeyRef"]
    days = next(
        doc for doc in d if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == ref["name"]
    )["data"][ref["key"]]
    assert 1 <= int(days) <= 400
    assert env["SHADOW_AB_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "shadow-ab-pg-app"
