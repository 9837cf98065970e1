"""The manifests drive the real commands: the mirror's and the health sampler's arguments plus
the shipped mirror.yaml pass the mirror's own settings validation, and every ``SHADOW_AB_*``
variable a container sets is a setting of the command it runs (pydantic-settings would
otherwise ignore a misspelt one silently)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from k8s_tools import find
from pydantic_settings import BaseSettings

import mirror.cli
from api.settings import APISettings
from ingester.settings import IngestSettings
from mirror.config import SINK_CLOSE_TIMEOUT_S, MirrorSettings
from shadow_ab.kafka_security import VARIABLES as KAFKA_SECURITY_VARIABLES
from shadow_ab.settings import CommonSettings

pytestmark = pytest.mark.timeout(900)

Docs = dict[str, list[dict[str, Any]]]
OVERLAYS = ["dev", "prod"]


class _Captured(Exception):
    pass


def _pod(doc: dict[str, Any]) -> dict[str, Any]:
    if doc["kind"] == "CronJob":
        return dict(doc["spec"]["jobTemplate"]["spec"]["template"]["spec"])
    return dict(doc["spec"]["template"]["spec"])


def _mirror_settings(
    docs: list[dict[str, Any]], name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[MirrorSettings, dict[str, Any]]:
    """Run the real `shadow-ab mirror` CLI on the workload's args (the ConfigMap written to a
    local file) up to the point where it would open its sink; return the settings it built."""
    kind = "StatefulSet" if name == "shadow-ab-mirror" else "Deployment"
    pod = _pod(find(docs, kind, name))
    container = pod["containers"][0]
    env = {e["name"]: e for e in container.get("env", [])}
    cm_name = next(v["configMap"]["name"] for v in pod["volumes"] if v["name"] == "config")
    mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "config")
    data = find(docs, "ConfigMap", cm_name)["data"]
    (tmp_path / "mirror.yaml").write_text(data["mirror.yaml"])
    args = []
    for arg in container["args"][1:]:
        arg = arg.replace(f"{mount}/", f"{tmp_path}/")
        arg = arg.replace("$(DEPLOYMENT_NAME)", "dep-under-test")
        args.append(arg)
    assert "DEPLOYMENT_NAME" in env
    for var in list(os.environ):
        if var.startswith("SHADOW_AB_MIRROR_"):
            monkeypatch.delenv(var)
    captured: dict[str, MirrorSettings] = {}

    def fake_open_sink(settings: MirrorSettings) -> Any:
        captured["settings"] = settings
        raise _Captured

    monkeypatch.setattr(mirror.cli, "_open_sink", fake_open_sink)
    result = CliRunner().invoke(mirror.cli.mirror, args)
    assert isinstance(result.exception, _Captured), result.output
    return captured["settings"], container


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_mirror_accepts_its_manifest(
    overlay: str, docs: Docs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, container = _mirror_settings(docs[overlay], "shadow-ab-mirror", tmp_path, monkeypatch)
    assert settings.host == "0.0.0.0"
    assert settings.port == container["ports"][0]["containerPort"]
    # The probes and Prometheus use the admin port; the client port serves clients only.
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert settings.admin_port == ports["admin"] != settings.port
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert settings.deployment == "dep-under-test"
    assert settings.incumbent.url == "http://shadow-ab-incumbent:8000"
    assert settings.candidate.url == "http://shadow-ab-candidate:8001"
    assert (settings.incumbent.flavor, settings.candidate.flavor) == ("vllm", "trtllm")
    assert 0 < settings.shadow.rate <= 1 and settings.guard.enabled
    # The mirror pods leave health sampling to the health sampler Deployment.
    assert settings.health_enabled is False
    # Records go to Kafka, spooled on the spool volume, bounded below its size limit.
    assert settings.kafka is not None
    assert settings.kafka.bootstrap == "shadow-ab-kafka-bootstrap:9092"
    spool = next(m for m in container["volumeMounts"] if m["name"] == "spool")
    assert str(settings.kafka.spool_dir) == spool["mountPath"]
    assert settings.kafka.spool_max_bytes < 2 * 1024**3  # emptyDir sizeLimit 2Gi
    grace = _pod(find(docs[overlay], "StatefulSet", "shadow-ab-mirror"))[
        "terminationGracePeriodSeconds"
    ]
    assert settings.drain_timeout_s + SINK_CLOSE_TIMEOUT_S < grace


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_health_sampler_accepts_its_manifest(
    overlay: str, docs: Docs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, container = _mirror_settings(docs[overlay], "shadow-ab-health", tmp_path, monkeypatch)
    assert "--health-only" in container["args"]
    assert settings.host == "0.0.0.0"
    assert settings.kafka is not None and settings.health.interval_s > 0


SETTINGS: dict[str, tuple[type[BaseSettings], str]] = {
    "mirror": (MirrorSettings, "SHADOW_AB_MIRROR_"),
    "ingest": (IngestSettings, "SHADOW_AB_"),
    "api": (APISettings, "SHADOW_AB_"),
    "report": (CommonSettings, "SHADOW_AB_"),
    "db": (CommonSettings, "SHADOW_AB_"),
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_shadow_ab_variable_is_a_setting(overlay: str, docs: Docs) -> None:
    seen = 0
    for doc in docs[overlay]:
        if doc["kind"] not in ("Deployment", "StatefulSet", "Job", "CronJob"):
            continue
        for c in _pod(doc)["containers"]:
            if not c["image"].startswith("registry.example.com/shadow-ab/"):
                continue
            cls, prefix = SETTINGS[c["args"][0]]
            for env in c.get("env", []):
                name = env["name"]
                if not name.startswith("SHADOW_AB_"):
                    continue
                if name == "SHADOW_AB_DATABASE_URL":  # shared by every CommonSettings
                    seen += 1
                    continue
                if name in KAFKA_SECURITY_VARIABLES:  # every Kafka client's TLS/SASL settings
                    seen += 1
                    continue
                assert name.startswith(prefix), name
                field = name.removeprefix(prefix).lower().split("__")[0]
                assert field in cls.model_fields, f"{name} is not a setting of {cls.__name__}"
                seen += 1
    assert seen >= 6


def test_ingester_settings_from_its_manifest(docs: Docs, monkeypatch: pytest.MonkeyPatch) -> None:
    container = _pod(find(docs["prod"], "Deployment", "shadow-ab-ingester"))["containers"][0]
    for env in container["env"]:
        if "value" in env:
            monkeypatch.setenv(env["name"], env["value"])
    monkeypatch.setenv("SHADOW_AB_DATABASE_URL", "postgresql://app:pw@shadow-ab-pg-rw:5432/app")
    flags = dict(a.removeprefix("--").split("=", 1) for a in container["args"][1:])
    settings = IngestSettings(
        kafka_bootstrap=flags["kafka"], ingest_metrics_port=int(flags["metrics-port"])
    )
    assert settings.ingest_metrics_host == "0.0.0.0"
    assert settings.ingest_create_topics is False
    assert settings.ingest_workers == 2
    # Worker i serves on --metrics-port + i: one named, scraped port per worker.
    ports = sorted(p["containerPort"] for p in container["ports"])
    first = settings.ingest_metrics_port
    assert ports == list(range(first, first + settings.ingest_workers))
    monitor = find(docs["prod"], "PodMonitor", "shadow-ab-workers")["spec"]
    scraped = {e["port"] for e in monitor["podMetricsEndpoints"]}
    assert {p["name"] for p in container["ports"]} <= scraped


def test_api_settings_from_its_manifest(
    docs: Docs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    container = _pod(find(docs["prod"], "Deployment", "shadow-ab-api"))["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("a-token-of-thirty-two-characters-x: [read]\n")
    url = env["SHADOW_AB_API_DATABASE_URL"]["value"]
    url = url.replace("$(PGUSER)", "shadow_ab_reader").replace("$(PGPASSWORD)", "pw")
    monkeypatch.setenv("SHADOW_AB_API_DATABASE_URL", url)
    monkeypatch.setenv("SHADOW_AB_API_TOKENS_FILE", str(tokens))
    flags = dict(a.removeprefix("--").split("=", 1) for a in container["args"][1:])
    settings = APISettings(api_host=flags["host"], api_port=int(flags["port"]))
    assert settings.store_url.startswith("postgresql+psycopg://shadow_ab_reader:pw@shadow-ab-pg-ro")
    assert settings.api_port == container["ports"][0]["containerPort"]
    assert len(settings.token_map) == 1
    mount = next(m for m in container["volumeMounts"] if m["name"] == "tokens")
    assert env["SHADOW_AB_API_TOKENS_FILE"]["value"].startswith(mount["mountPath"] + "/")
