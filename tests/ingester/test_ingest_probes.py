"""Probe records (the mirror's synthetic pairs, issue 12) through the real Kafka, the ingester and
the real PostgreSQL: their marks are stored as sent, the evaluator scores them from the store,
and they stay out of the client figures."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from ingest_harness import Topics, count_rows, produce, run_until_committed, settings_for
from quality_factories import quality_pairs
from sqlalchemy import Engine, text

from evaluator.quality import analyze_quality
from evaluator.review import data_extent

pytestmark = pytest.mark.slow

T0 = datetime(2026, 11, 2, tzinfo=UTC)


def test_probe_records_are_stored_marked_and_scored(
    kafka_bootstrap: str, ingest_db_url: str, ingest_engine: Engine, topics: Topics
) -> None:
    gen = quality_pairs(
        seed=3,
        incumbent={"probe_accuracy": 1.0},
        candidate={"probe_accuracy": 0.5},
        probe_pairs=60,
        client_pairs=40,
        start=T0,
        days=2,
        deployment=topics.deployment,
    )
    n = len(gen.records)
    produce(
        kafka_bootstrap,
        topics.exchanges,
        [(str(r.pair_id).encode(), r.to_json()) for r in gen.records],
    )
    run_until_committed(settings_for(topics, kafka_bootstrap, ingest_db_url), n, "every offset")
    assert count_rows(ingest_engine, "exchanges", topics.deployment) == n == 200

    with ingest_engine.connect() as conn:
        stored = {
            (str(pair_id), role): (synthetic, probe_id)
            for pair_id, role, synthetic, probe_id in conn.execute(
                text(
                    "SELECT pair_id, role, synthetic, probe_id FROM exchanges WHERE deployment = :d"
                ),
                {"d": topics.deployment},
            )
        }
    assert stored == {
        (str(r.pair_id), r.role.value): (r.synthetic, r.probe_id) for r in gen.records
    }

    window = (T0, T0 + timedelta(days=2))
    section = analyze_quality(ingest_engine, topics.deployment, window)
    by_key = {m.key: m for m in section.measurements()}
    assert by_key["quality.probe.incumbent_accuracy"].value == 1.0
    cand = by_key["quality.probe.candidate_accuracy"]
    drawn = [x["correct"] for x in gen.ledger if x["role"] == "candidate" and x["event"] == "probe"]
    assert cand.n == 60 and cand.value == pytest.approx(sum(drawn) / 60)
    assert by_key["quality.probe.accuracy_delta"].n == 60
    # The client figures count the 40 client pairs only.
    assert data_extent(ingest_engine, topics.deployment, window)["pairs"] == 40
