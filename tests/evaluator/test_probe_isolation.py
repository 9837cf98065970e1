"""The mirror's probes are not client traffic: every figure of a review outside ``quality.*`` is
the same with the probes in the store as without them, however badly the probes went (failed,
slow, divergent, crowded into one hour). Every reader of ``exchanges`` filters with
``storage.models.client_traffic``; a reader that forgets it fails here, whichever analysis it
belongs to, on PostgreSQL (rollups in SQL) and on SQLite."""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from evaluator.policy import default_policy
from evaluator.review import Review, build_review, default_analyses, jsonable
from evaluator.semantic import SemanticConfig
from shadow_ab.dev.synthetic import exchange
from shadow_ab.dev.synthetic import health as health_sample
from shadow_ab.probes import load_probe_set
from shadow_ab.records import ExchangeRecord, HealthSample
from storage.db import make_engine
from storage.migrate import upgrade
from storage.write import write_exchanges, write_health

DEP = "probe-isolation"
T0 = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(days=3)
"""Three days up to now, so the last hours are still open: the review reads them raw, the
closed ones from the rollups, and probes sit in both."""
DAYS = 3
FAILED: dict[str, Any] = {"status": "http_error", "http_status": 500}
TIMED_OUT: dict[str, Any] = {"status": "timeout", "http_status": None, "error": "shadow timeout"}


@pytest.fixture(params=["postgresql", "sqlite"])
def twin_stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Engine, Engine]]:
    """Two empty migrated stores of one kind: one gets client traffic, the other the same plus
    probes (in one store, refreshed rollups would hide later rows from the comparison)."""
    if request.param == "postgresql":
        dbs = request.getfixturevalue("pg_databases")
        template = request.getfixturevalue("pg_template")
        made = [dbs.create(template=template) for _ in range(2)]
        engines = [make_engine(url) for _, url in made]
        yield engines[0], engines[1]
        for engine in engines:
            engine.dispose()
        for name, _ in made:
            dbs.drop(name)
    else:
        urls = [f"sqlite:///{tmp_path}/store{i}.db" for i in range(2)]
        for url in urls:
            upgrade(url)
        engines = [make_engine(url) for url in urls]
        yield engines[0], engines[1]
        for engine in engines:
            engine.dispose()


def _client() -> tuple[list[ExchangeRecord], list[HealthSample]]:
    """Three days of pairs every 6 minutes with a replay each, a few failures and divergences,
    and both engines' health with one candidate restart."""
    rng = random.Random(3)
    records = []
    n = DAYS * 24 * 10
    for i in range(n):
        pair = uuid.UUID(int=i + 1)
        sent = T0 + timedelta(minutes=6 * i, seconds=rng.random())
        text = f"answer {i} " * 8
        for k, role in enumerate(("incumbent", "candidate", "replay")):
            failed = role == "candidate" and rng.random() < 0.02
            records.append(
                exchange(
                    deployment=DEP,
                    pair_id=pair,
                    role=role,
                    sent_at=sent + timedelta(milliseconds=5 * k),
                    seed=i * 3 + k,
                    output_text=text + ("other" if role != "incumbent" and i % 9 == 0 else ""),
                    ttft_s=0.04 * (1.1 if role == "candidate" else 1.0) + rng.random() / 50,
                    **(FAILED if failed else {}),
                )
            )
    health: list[HealthSample] = []
    for role, engine in (("incumbent", "vllm@incumbent"), ("candidate", "trtllm@candidate")):
        for i in range(DAYS * 24 * 60):
            ts = T0 + timedelta(minutes=i)
            restarted = role == "candidate" and ts >= T0 + timedelta(days=1, hours=5)
            start = 1_790_000_000.0 + (100_000 if restarted else 0)
            health.append(
                health_sample(
                    deployment=DEP, engine=engine, role=role, ts=ts, process_start_time=start
                )
            )
    return records, health


def _probes() -> list[ExchangeRecord]:
    """300 probe pairs crowded into a closed hour and the last, open half hour: the candidate's
    half failing or timing out, every answer slow and different, at high concurrency. As client
    traffic they would move errors, latency, parity, divergence and incidents."""
    probe_set = load_probe_set()
    out = []
    closed, open_ = T0 + timedelta(days=1, hours=12), T0 + timedelta(days=DAYS, minutes=-35)
    for i in range(300):
        sent = (closed if i < 150 else open_) + timedelta(seconds=12 * (i % 150))
        pair = uuid.UUID(int=10**9 + i)
        for k, role in enumerate(("incumbent", "candidate", "replay")):
            bad = role == "candidate" and i % 2 == 0
            out.append(
                exchange(
                    deployment=DEP,
                    pair_id=pair,
                    role=role,
                    sent_at=sent + timedelta(milliseconds=5 * k),
                    seed=10**6 + i * 3 + k,
                    synthetic="probe",
                    probe_id=probe_set.key(probe_set.probes[i % 30]),
                    output_text=f"{role} says {i}",
                    ttft_s=20.0,
                    e2e_s=60.0,
                    inflight_incumbent=40,
                    inflight_candidate=30,
                    **((FAILED if i % 4 == 0 else TIMED_OUT) if bad else {}),
                )
            )
    return out


def _review(engine: Engine) -> Review:
    run = default_analyses(semantic_config=SemanticConfig(max_new_per_review=20))
    policy = default_policy().with_minimums(min_pairs=100, min_days=1.0, horizon_days=3.0)
    window = (T0, T0 + timedelta(days=DAYS))
    return build_review(engine, DEP, window, policy, analyses=run, store=False, with_html=False)


def _figures(review: Review) -> dict[str, Any]:
    return _untimed(
        {
            m.key: [
                m.value,
                m.n,
                None if m.interval is None else list(dataclasses.astuple(m.interval)),
            ]
            for m in review.measurements
            if not m.key.startswith("quality.")
        }
    )


def _untimed(value: Any) -> Any:
    """``value`` as JSON without the stages' own run times (``seconds_*``), floats to 9
    significant digits (PostgreSQL may add a sketch's floats up in another order)."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if not str(k).startswith("seconds")}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    if isinstance(value, float):
        return float(f"{value:.9g}")
    return value


def test_probes_change_no_figure_outside_quality(twin_stores: tuple[Engine, Engine]) -> None:
    clean, probed = twin_stores
    records, health = _client()
    probes = _probes()
    for engine in twin_stores:
        write_exchanges(engine, records)
        write_health(engine, health)
    write_exchanges(probed, probes)

    a, b = _review(clean), _review(probed)
    assert _figures(a) == _figures(b)
    assert a.data == b.data
    assert a.sections.keys() == b.sections.keys()
    for name in a.sections.keys() - {"quality"}:
        assert _untimed(jsonable(a.sections[name])) == _untimed(jsonable(b.sections[name])), name
    # The comparison is not vacuous: the probes are there, and the quality analysis sees them.
    probe_rows = b.sections["quality"]["detail"]["probes"]["engines"]["candidate"]["overall"]
    assert probe_rows["n"] == 150  # the answered half: failed probes are counted apart
    assert a.data["pairs"] == DAYS * 24 * 10
