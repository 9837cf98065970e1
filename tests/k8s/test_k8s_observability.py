"""The dashboard and the alert rules only use metric names the code declares, the dashboard ships
as a labelled ConfigMap, and every alert carries runbook-style annotations."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_tools import K8S, REPO, Tools, promql_errors

pytestmark = pytest.mark.timeout(900)

METRIC_MODULES = ["mirror/metrics.py", "ingester/metrics.py", "storage/metrics.py"]
METRIC_CLASSES = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}
NAME = re.compile(r"\bshadow_ab_[a-z0-9_]+\b")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
DASHBOARD = K8S / "observability" / "grafana-dashboard.json"
ALERTS = K8S / "observability" / "alerts.yaml"


def declared_metrics(paths: list[Path]) -> dict[str, str]:
    """Metric name -> class, from the ``Counter("name", ...)``-style calls in the modules."""
    out: dict[str, str] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            cls = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            first = node.args[0]
            if (
                cls in METRIC_CLASSES
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
            ):
                out[first.value] = cls
    return out


def undeclared(names: set[str], declared: dict[str, str]) -> set[str]:
    missing = set()
    for name in names:
        if name in declared:
            continue
        base = next((name[: -len(s)] for s in HISTOGRAM_SUFFIXES if name.endswith(s)), None)
        if base is not None and declared.get(base) in ("Histogram", "Summary"):
            continue
        missing.add(name)
    return missing


def dashboard_exprs() -> list[str]:
    data = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in data["panels"] for t in p.get("targets", [])]


def alert_rules() -> list[dict[str, Any]]:
    rule = yaml.safe_load(ALERTS.read_text())
    return [r for g in rule["spec"]["groups"] for r in g["rules"]]


@pytest.fixture(scope="module")
def declared() -> dict[str, str]:
    found = declared_metrics([REPO / p for p in METRIC_MODULES])
    assert "shadow_ab_mirror_ttft_seconds" in found and "shadow_ab_ingest_consumer_lag" in found
    return found


def test_dashboard_metrics_are_declared(declared: dict[str, str]) -> None:
    names = {n for e in dashboard_exprs() for n in NAME.findall(e)}
    assert len(names) >= 20
    assert undeclared(names, declared) == set()


def test_alert_metrics_are_declared(declared: dict[str, str]) -> None:
    names = {n for r in alert_rules() for n in NAME.findall(r["expr"])}
    assert undeclared(names, declared) == set()


def test_the_check_catches_an_undeclared_name(declared: dict[str, str]) -> None:
    assert undeclared({"shadow_ab_mirror_ttft_seconds_bucket"}, declared) == set()
    assert undeclared({"shadow_ab_mirror_ttft_secs_bucket"}, declared) == {
        "shadow_ab_mirror_ttft_secs_bucket"
    }
    # _bucket only exists for histograms
    assert undeclared({"shadow_ab_engine_up_bucket"}, declared) == {"shadow_ab_engine_up_bucket"}


def test_dashboard_covers_the_promised_views() -> None:
    exprs = "\n".join(dashboard_exprs())
    for needle in [
        "histogram_quantile(0.95, sum by (le, role) (rate(shadow_ab_mirror_ttft_seconds_bucket",
        "histogram_quantile(0.95, sum by (le, role) (rate(shadow_ab_mirror_e2e_seconds_bucket",
        "shadow_ab_mirror_shadow_decisions_total",
        "shadow_ab_mirror_guard_state",
        "shadow_ab_mirror_guard_rate_ratio",
        "shadow_ab_mirror_spool_bytes",
        "shadow_ab_mirror_sink_errors_total",
        "shadow_ab_ingest_consumer_lag",
        "shadow_ab_engine_up",
    ]:
        assert needle in exprs, needle
    for expr in dashboard_exprs():
        assert expr.count("(") == expr.count(")"), expr


def test_queries_parse_as_promql(tools: Tools) -> None:
    # Grafana fills $__rate_interval in before Prometheus sees the query.
    exprs = [e.replace("$__rate_interval", "5m") for e in dashboard_exprs()]
    exprs += [r["expr"] for r in alert_rules()]
    assert promql_errors(tools, exprs) == ""
    # ...and the check does catch a broken one.
    report = promql_errors(tools, ["sum(rate(shadow_ab_mirror_requests_total[5m]) by (code)"])
    assert "parse error" in report


def test_dashboard_is_what_the_script_makes() -> None:
    spec = importlib.util.spec_from_file_location(
        "make_dashboard", K8S / "observability" / "make_dashboard.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert json.loads(DASHBOARD.read_text()) == module.dashboard()


def test_alerts_have_runbooks() -> None:
    rules = alert_rules()
    names = {r["alert"] for r in rules}
    for expected in [
        "ShadowAbRecordsDropped",
        "ShadowAbConsumerLagGrowing",
        "ShadowAbCandidateDown",
        "ShadowAbSpoolFilling",
        "ShadowAbGuardBackingOff",
    ]:
        assert expected in names
    readme = (K8S / "README.md").read_text()
    for r in rules:
        ann = r["annotations"]
        assert {"summary", "description", "runbook"} <= set(ann), r["alert"]
        assert r["labels"]["severity"] in ("warning", "critical")
        assert r["expr"].count("(") == r["expr"].count(")")
        assert r["alert"] in readme, f"{r['alert']} has no runbook entry in k8s/README.md"


def test_dashboard_ships_as_a_labelled_configmap(docs: dict[str, list[dict[str, Any]]]) -> None:
    for overlay_docs in docs.values():
        cms = [
            d
            for d in overlay_docs
            if d["kind"] == "ConfigMap"
            and d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"
        ]
        assert len(cms) == 1
        (content,) = cms[0]["data"].values()
        assert json.loads(content)["uid"] == "shadow-ab"
