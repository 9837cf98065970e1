"""``shadow-ab demo --engines vllm-cpu`` on the session's two real engines (bf16 incumbent, fp32
candidate): the run is recorded, reviewed, and its report says what the engines were."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from evaluator.review import SIMULATOR_NOTE
from shadow_ab.dev.demo import real_engines_note, run_demo
from shadow_ab.dev.engines.vllm_cpu import RunningVllm
from storage.db import make_engine
from storage.models import Deployment, Exchange

pytestmark = [
    pytest.mark.real_engine,
    pytest.mark.slow,
    pytest.mark.timeout(1200),
    # scipy warns when a bootstrap interval comes out NaN on few pairs
    pytest.mark.filterwarnings("ignore::scipy.stats.DegenerateDataWarning"),
]


def test_the_demo_on_real_vllm(
    vllm_bf16: RunningVllm,
    vllm_fp32: RunningVllm,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SHADOW_AB_HOME", str(tmp_path / "home"))
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    result = run_demo(
        duration_s=16.0,
        deployment="demo-real",
        database_url=url,
        engines="vllm-cpu",
        running_engines=(vllm_bf16.base_url, vllm_fp32.base_url),
        progress=False,
    )
    assert result.decision in ("GO", "NO-GO", "INCONCLUSIVE")
    page = result.report_path.read_text()
    note = real_engines_note("X", "Y").split("(the CPU build")[0].replace(" X", "")
    assert note.startswith("The engines of this deployment were real vLLM")
    assert note in page and page.index(note) < page.index('class="banner')
    assert "numerics" in page and "plumbing" in page
    assert SIMULATOR_NOTE[:40] not in page

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            d = conn.execute(select(Deployment).where(Deployment.name == "demo-real")).one()
            roles = set(
                conn.execute(
                    select(Exchange.role).where(Exchange.deployment == "demo-real").distinct()
                ).scalars()
            )
            statuses = set(
                conn.execute(
                    select(Exchange.status).where(Exchange.deployment == "demo-real").distinct()
                ).scalars()
            )
    finally:
        engine.dispose()
    assert "real" in d.incumbent_engine and "bfloat16" in d.incumbent_engine
    assert "float32" in d.candidate_engine and d.hardware.startswith("real vLLM on CPU")
    assert d.incumbent_version == d.candidate_version != "unknown"
    assert roles == {"incumbent", "candidate", "replay"}
    assert statuses == {"ok"}  # the mix fits the tiny model's context
