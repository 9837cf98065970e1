"""``shadow-ab report`` end to end on a SQLite store with the real analyses: formats, output,
the stored report, the progress bar, and errors that say what to do."""

from __future__ import annotations

import random
import uuid
from datetime import timedelta
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from factories import exchange
from review_factories import T0
from sqlalchemy import func, select

from evaluator.report_cli import ProgressBar, report
from shadow_ab.records import ExchangeRecord
from storage.db import make_engine
from storage.migrate import upgrade
from storage.models import Report
from storage.write import write_exchanges

DEP = "cli-dep"


def _records(n: int = 240) -> list[ExchangeRecord]:
    rng = random.Random(3)
    out = []
    for i in range(n):
        sent = T0 + timedelta(minutes=7 * i)
        pair = uuid.uuid4()
        roles = ("incumbent", "candidate", "replay") if i % 4 == 0 else ("incumbent", "candidate")
        for role in roles:
            slow = 1.3 if role == "candidate" else 1.0
            out.append(
                exchange(
                    deployment=DEP,
                    pair_id=pair,
                    role=role,
                    engine=f"sim@{role}",
                    sent_at=sent,
                    ttft_s=0.04 * slow * rng.lognormvariate(0, 0.1),
                    e2e_s=0.5 * slow * rng.lognormvariate(0, 0.1),
                    tpot_s=0.008 * slow * rng.lognormvariate(0, 0.1),
                    itl_s=[0.008 * slow * rng.lognormvariate(0, 0.1) for _ in range(4)],
                    prompt_tokens=100,
                    completion_tokens=60,
                    finish_reason="stop",
                    output_text="the same answer",
                    request={"temperature": 0, "max_tokens": 60},
                )
            )
    return out


@pytest.fixture(scope="module")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('report') / 'store.db'}"
    upgrade(url)
    engine = make_engine(url)
    write_exchanges(engine, _records())
    engine.dispose()
    return url


def _reports(url: str) -> int:
    engine = make_engine(url)
    with engine.connect() as conn:
        n = int(conn.execute(select(func.count()).select_from(Report)).scalar_one())
    engine.dispose()
    return n


def test_html_report_to_a_file(store_url: str, tmp_path: Path) -> None:
    out = tmp_path / "out" / "report.html"
    before = _reports(store_url)
    result = CliRunner().invoke(
        report, ["--deployment", DEP, "--database-url", store_url, "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page
    # 30 % slower on every pair: the latency criteria are beyond their thresholds on their
    # whole interval, but 28 hours are fewer than the policy's 3 minimum days: ALERTs, shown
    # and not yet a NO-GO (the sequential decision).
    assert 'class="banner INCONCLUSIVE"' in page and '<td class="ALERT">ALERT</td>' in page
    assert "INCONCLUSIVE: " in result.stderr and f"report written to {out}" in result.stderr
    assert "ALERT(s), not NO-GO" in result.stderr
    assert "latency.ttft.p95.ratio" in result.stderr
    assert _reports(store_url) == before + 1


def test_json_to_stdout_without_storing(store_url: str, tmp_path: Path) -> None:
    policy = tmp_path / "lenient.yaml"
    policy.write_text(
        "name: lenient\nmin_pairs: 100\nmin_days: 0.5\ncriteria:\n"
        "  - latency.ttft.p95.ratio <= 1.5\n"
    )
    before = _reports(store_url)
    result = CliRunner().invoke(
        report,
        [
            "-d",
            DEP,
            "--database-url",
            store_url,
            "--format",
            "json",
            "--no-store",
            "--policy",
            str(policy),
            "--no-progress",
            "--from",
            T0.isoformat(),
            "--to",
            (T0 + timedelta(days=1)).isoformat(),
        ],
    )
    assert result.exit_code == 0, result.stderr
    body = orjson.loads(result.stdout)
    assert body["policy"]["name"] == "lenient"
    assert body["verdict"]["decision"] == "GO", body["verdict"]["reason"]
    assert body["window"]["to"].startswith("2026-11-03")
    assert 100 < body["data"]["pairs"] < 240  # only the first day's pairs
    assert _reports(store_url) == before


def test_markdown(store_url: str) -> None:
    result = CliRunner().invoke(
        report, ["-d", DEP, "--database-url", store_url, "--format", "md", "--no-store"]
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("# Migration review: cli-dep")
    assert "| ALERT | latency.ttft.p95.ratio <= 1.1 |" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-d", "nope"], f"known deployments: {DEP}"),
        (["-d", DEP, "--from", "2027-01-01", "--to", "2027-01-02"], "no mirrored pairs between"),
        (["-d", DEP, "--from", "2027-01-02", "--to", "2027-01-01"], "is not before"),
        (["-d", DEP, "--from", "yesterday"], "is not a time"),
        (["-d", DEP, "--policy", "/nonexistent.yaml"], "policy file /nonexistent.yaml not found"),
    ],
)
def test_errors_say_what_to_do(store_url: str, args: list[str], message: str) -> None:
    result = CliRunner().invoke(report, [*args, "--database-url", store_url])
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_progress_bar_follows_the_callbacks() -> None:
    bar = ProgressBar(enabled=True)
    with bar:
        for stage, f in [("incidents", 0.1), ("latency", 0.5), ("latency", 0.4), ("store", 1.0)]:
            bar(stage, f)
    assert bar._done == 1000
    silent = ProgressBar(enabled=False)
    with silent:
        silent("latency", 0.5)
    assert silent._done == 0


def test_the_deployments_stored_policy_is_used(store_url: str) -> None:
    from sqlalchemy import update

    from evaluator.policy import default_policy
    from storage.models import Deployment

    stored = default_policy().with_minimums(min_pairs=10, note="kept with the deployment")
    engine = make_engine(store_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                update(Deployment).where(Deployment.name == DEP).values(policy=stored.to_dict())
            )
        result = CliRunner().invoke(
            report, ["-d", DEP, "--database-url", store_url, "--format", "json", "--no-store"]
        )
    finally:
        with engine.begin() as conn:
            conn.execute(update(Deployment).where(Deployment.name == DEP).values(policy=None))
        engine.dispose()
    assert result.exit_code == 0, result.stderr
    body = orjson.loads(result.stdout)
    assert body["policy"]["min_pairs"] == 10
    assert body["policy"]["notes"] == ["kept with the deployment"]


def test_divergence_options_reach_the_report(store_url: str) -> None:
    args = ["-d", DEP, "--database-url", store_url, "--format", "json", "--no-store"]
    args += ["--no-progress", "--near-tie-nats", "0.1", "--api-url", "https://api.example/"]
    result = CliRunner().invoke(report, args)
    assert result.exit_code == 0, result.stderr
    body = orjson.loads(result.stdout)
    div = body["sections"]["divergence"]
    assert div["config"]["near_tie_nats"] == 0.1
    assert "within 0.1 nats (the policy's near_tie_nats" in div["config"]["near ties"]
    # the flag overrides the policy's margin, and the report says so
    assert body["policy"]["near_tie_nats"] == 0.1
    assert any("--near-tie-nats" in note for note in body["policy"]["notes"])
    assert all(p["link"].startswith("https://api.example/v1/") for p in div["worst_pairs"])
    bad = CliRunner().invoke(report, [*args[:-4], "--near-tie-nats", "-1"])
    assert bad.exit_code == 2 and "near-tie-nats" in bad.stderr


def test_the_policy_files_near_tie_margin_reaches_the_divergence(
    store_url: str, tmp_path: Path
) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("near_tie_nats: 0.2\ncriteria: ['divergence.hard_excess_rate <= 0.02']\n")
    args = ["-d", DEP, "--database-url", store_url, "--format", "json", "--no-store"]
    result = CliRunner().invoke(report, [*args, "--no-progress", "--policy", str(policy)])
    assert result.exit_code == 0, result.stderr
    body = orjson.loads(result.stdout)
    assert body["sections"]["divergence"]["config"]["near_tie_nats"] == 0.2
    assert body["policy"]["near_tie_nats"] == 0.2 and body["policy"]["notes"] == []
    hard = next(m for m in body["measurements"] if m["key"] == "divergence.hard_excess_rate")
    assert "above 0.2 nats" in hard["detail"]
