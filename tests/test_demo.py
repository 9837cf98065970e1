"""``shadow-ab demo``: a short run on the embedded defaults (SQLite under the state dir, the
direct sink) ends with a verdict and a self-contained HTML report that says the engines were
simulated."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from evaluator.review import SIMULATOR_NOTE
from shadow_ab.dev.demo import demo
from storage.db import make_engine
from storage.models import Deployment, Exchange, HealthSampleRow, Report


# scipy warns when a bootstrap interval comes out NaN on few pairs (evaluator/stats.py, not
# the demo's code); the verdict then treats that criterion as INCONCLUSIVE.
@pytest.mark.filterwarnings("ignore::scipy.stats.DegenerateDataWarning")
@pytest.mark.slow
def test_demo_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHADOW_AB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SHADOW_AB_DATABASE_URL", raising=False)  # the embedded default
    result = CliRunner().invoke(
        demo, ["--duration", "12", "--deployment", "demo-smoke", "--time-scale", "600"]
    )
    assert result.exit_code == 0, result.output + result.stderr
    assert result.stdout.startswith("verdict: ")
    decision = result.stdout.split()[1]
    assert decision in ("GO", "NO-GO", "INCONCLUSIVE")
    report = tmp_path / "home" / "demo" / "demo-smoke" / "report.html"
    assert f"report:  {report}" in result.stdout
    assert "SIMULATORS" in result.stderr and "concurrency" in result.stderr
    page = report.read_text()
    assert f'class="banner {decision}"' in page
    # Nothing generated is presented as measured: the page opens with the simulator note.
    note = SIMULATOR_NOTE.split(":")[0].split("simulator, ")[1]
    assert note == "not real vLLM or TensorRT-LLM"
    assert page.index(note) < page.index('class="banner')
    assert "<svg" in page and "<script" not in page

    engine = make_engine(f"sqlite:///{tmp_path / 'home' / 'shadow-ab.db'}")
    try:
        with engine.connect() as conn:
            roles = set(
                conn.execute(
                    select(Exchange.role).where(Exchange.deployment == "demo-smoke").distinct()
                ).scalars()
            )
            health = conn.execute(
                select(HealthSampleRow.engine).where(HealthSampleRow.deployment == "demo-smoke")
            ).first()
            dep = conn.execute(
                select(Deployment.hardware, Deployment.ended_at).where(
                    Deployment.name == "demo-smoke"
                )
            ).one()
            verdict = conn.execute(
                select(Report.verdict).where(Report.deployment == "demo-smoke")
            ).scalar_one()
    finally:
        engine.dispose()
    assert roles == {"incumbent", "candidate", "replay"}
    assert health is not None  # the health sampler ran inside the mirror
    assert "simulated" in dep.hardware and dep.ended_at is not None
    assert verdict == decision


@pytest.mark.filterwarnings("ignore::scipy.stats.DegenerateDataWarning")
@pytest.mark.slow
def test_demo_through_kafka_into_postgresql(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kafka_bootstrap: str,
    empty_pg_url: str,
) -> None:
    monkeypatch.setenv("SHADOW_AB_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(
        demo,
        [
            "--duration",
            "8",
            "--deployment",
            "demo-kafka",
            "--database-url",
            empty_pg_url,
            "--kafka",
            kafka_bootstrap,
            "-o",
            str(tmp_path / "r.html"),
        ],
    )
    assert result.exit_code == 0, result.output + result.stderr
    assert "shadow-ab ingest" in result.stderr  # the records went through Kafka
    assert (tmp_path / "r.html").read_text().count("<svg") >= 1
    engine = make_engine(empty_pg_url)
    try:
        with engine.connect() as conn:
            roles = set(
                conn.execute(
                    select(Exchange.role).where(Exchange.deployment == "demo-kafka").distinct()
                ).scalars()
            )
            health = conn.execute(select(HealthSampleRow.engine)).first()
            reports = conn.execute(select(Report.verdict)).scalars().all()
    finally:
        engine.dispose()
    assert roles == {"incumbent", "candidate", "replay"}
    assert health is not None
    assert len(reports) == 1 and f"verdict: {reports[0]} " in result.stdout


def test_demo_on_real_vllm_says_to_prepare_it_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--engines vllm-cpu`` before ``shadow-ab engine vllm prepare``: a clear error naming
    the command, nothing started."""
    from shadow_ab.dev.engines import vllm_cpu

    try:
        vllm_cpu.check_machine()
    except vllm_cpu.EngineUnavailable as exc:
        pytest.skip(f"real vLLM cannot run here: {exc}")
    monkeypatch.setenv("SHADOW_AB_HOME", str(tmp_path / "home"))  # no venv there
    monkeypatch.delenv("SHADOW_AB_DATABASE_URL", raising=False)
    result = CliRunner().invoke(demo, ["--engines", "vllm-cpu", "--duration", "5"])
    assert result.exit_code == 1
    assert "run `shadow-ab engine vllm prepare` first" in result.stderr
    assert "vllm-venv" in result.stderr
    assert "SIMULATORS" not in result.stderr
