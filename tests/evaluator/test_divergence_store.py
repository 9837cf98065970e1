"""analyze_divergence through the store (SQLite and PostgreSQL): rates, noise floor, sampling."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from factories import exchange
from sqlalchemy import Engine, func, literal, select, tablesample

from api.redact import redact
from evaluator.divergence import DivergenceConfig, analyze_divergence, sample_pair_ids
from shadow_ab.records import ExchangeRecord, TokenLogprob
from simulator.generate import Departure, decode, prompt_state
from storage.models import EXCHANGES
from storage.write import write_exchanges

T0 = datetime(2026, 11, 30, 22, 0, tzinfo=UTC)  # two UTC days: 22:00 .. 02:00
DEP = "dep-div"
N_PAIRS = 200
N_DIVERGED = 40  # candidate: every 5th pair, half of them near ties
N_REPLAY = 100  # every 2nd pair replayed; every 40th pair's replay differs (5 of 100)


def _logprobs(tokens: list[Any]) -> list[TokenLogprob]:
    return [TokenLogprob(token=t.text, logprob=t.logprob, top=dict(t.top)) for t in tokens]


def _rec(pid: uuid.UUID, role: str, sent: datetime, tokens: list[Any], **kw: Any) -> ExchangeRecord:
    fields: dict[str, Any] = {
        "deployment": DEP,
        "pair_id": pid,
        "role": role,
        "sent_at": sent,
        "http_status": 200,
        "finish_reason": "length",
        "completion_tokens": len(tokens),
        "request": {"temperature": 0.0, "max_tokens": 24, "logprobs": True, "top_logprobs": 5},
        "output_text": "".join(t.text for t in tokens),
        "logprobs": _logprobs(tokens),
    }
    return exchange(**{**fields, **kw})


def build() -> tuple[list[ExchangeRecord], set[str], set[str]]:
    out: list[ExchangeRecord] = []
    diverged: set[str] = set()
    near: set[str] = set()
    for k in range(N_PAIRS):
        pid = uuid.UUID(int=(k * 7919 + 1) << 64)  # order by pair_id != order by time
        sent = T0 + timedelta(seconds=k * 72)  # 200 pairs over 4 h
        start = prompt_state("sim", f"prompt {k}", 1)
        ref, _ = decode(start, 24, top_k=5)
        out.append(_rec(pid, "incumbent", sent, ref))
        if k % 5 == 0:
            tie = k % 10 == 5  # the replayed (even) pairs' departures are hard ones
            dep, info = decode(start, 24, top_k=5, departure=Departure(4 + k % 13, tie))
            if info is None:  # no near tie (by margin) after the drawn position: from the start
                dep, info = decode(start, 24, top_k=5, departure=Departure(0, tie))
            assert info is not None
            out.append(_rec(pid, "candidate", sent, dep))
            diverged.add(str(pid))
            if tie:
                near.add(str(pid))
        else:
            out.append(_rec(pid, "candidate", sent, ref))
        if k % 2 == 0:
            replay = ref
            if k % 40 == 0:
                replay, info = decode(start, 24, top_k=5, departure=Departure(0, True))
                assert info is not None
            out.append(_rec(pid, "replay", sent + timedelta(seconds=2), replay))
    return out, diverged, near


def test_rates_noise_floor_and_examples(store: Engine) -> None:
    records, diverged, near = build()
    write_exchanges(store, records)
    seen: list[str] = []
    window = (T0 - timedelta(hours=1), T0 + timedelta(hours=5))
    section = analyze_divergence(store, DEP, window, progress=lambda s, f: seen.append(s))
    assert seen[-1] == "divergence done" and len(seen) == 3  # two days, then done
    m = {x.key: x for x in section.measurements()}
    cand, noise, excess = (
        m["divergence.candidate_rate"],
        m["divergence.noise_rate"],
        m["divergence.excess_rate"],
    )
    assert cand.value == N_DIVERGED / N_PAIRS and cand.n == N_PAIRS
    assert noise.value == 5 / N_REPLAY and noise.n == N_REPLAY
    assert excess.value == pytest.approx(N_DIVERGED / N_PAIRS - 5 / N_REPLAY)
    assert cand.interval is not None and cand.interval.contains(0.2)
    assert excess.interval is not None and 0 < excess.interval.low < 0.15 < excess.interval.high
    assert excess.n == N_REPLAY  # paired: the triads (every replayed pair has a candidate)
    assert m["divergence.near_tie_share"].value == 0.5
    hard = m["divergence.hard_excess_rate"]
    # On the triads (even k): the candidate's 20 departures there are hard, the replay's 5 are
    # near ties by margin.
    assert hard.value == pytest.approx(20 / N_REPLAY - 0.0)
    assert hard.interval is not None and 0.1 < hard.interval.low < 0.2 < hard.interval.high
    assert m["divergence.length_shift"].value == 0.0
    assert m["divergence.finish_mismatch.excess"].value == 0.0
    assert m["divergence.json_invalid.excess"].value is None  # no request asked for JSON
    sim = m["divergence.edit_similarity.mean"]
    assert sim.value is not None and 0.8 < sim.value < 1.0

    d = section.to_dict()
    assert {e["pair_id"] for e in d["examples"]["worst"]} <= diverged
    assert d["examples"]["worst"][0]["near_tie"] is False  # real divergences first
    assert {e["pair_id"] for e in d["examples"]["near_ties"]} <= near
    assert sum(d["histograms"]["first_divergence"]["candidate"]) == N_DIVERGED
    assert sum(d["histograms"]["edit_similarity"]["candidate"]) == N_PAIRS
    days = [(r["day"], r["candidate"]["pairs"]) for r in d["per_day"]]
    assert days == [("2026-11-30", 100), ("2026-12-01", 100)]
    assert sum(r["triads"]["n"] for r in d["per_day"]) == N_REPLAY
    assert {r["candidate"]["near_tie_share"] for r in d["per_day"]} == {0.5}
    worst = d["worst_pairs"]
    assert worst[0]["kind"] == "hard" and worst[0]["pair_id"] in diverged
    assert worst[0]["link"] == f"/v1/deployments/{DEP}/pairs/{worst[0]['pair_id']}?format=html"
    assert worst[0]["incumbent_text"] != worst[0]["candidate_text"]
    # The excerpts are content: the query API nulls them for a token without the scope.
    redacted, had_content = redact(d)
    assert had_content and redacted["worst_pairs"][0]["candidate_text"] is None


def test_sample_is_bounded_per_day(store: Engine) -> None:
    records, _, _ = build()
    write_exchanges(store, records)
    window = (T0, T0 + timedelta(hours=4))
    section = analyze_divergence(store, DEP, window, DivergenceConfig(max_pairs_per_day=30))
    summary = section.to_dict()["candidate"]
    assert summary["pairs_total"] == N_PAIRS
    assert summary["pairs_sampled"] == 60  # 30 per UTC day
    rate = section.measurements()[0]
    assert rate.n == 60 and rate.interval is not None and rate.interval.contains(0.2)


def test_no_replay_means_no_noise_floor(store: Engine) -> None:
    records, _, _ = build()
    write_exchanges(store, [r for r in records if r.role != "replay"])
    section = analyze_divergence(store, DEP, (T0, T0 + timedelta(hours=4)))
    m = {x.key: x for x in section.measurements()}
    assert m["divergence.candidate_rate"].value == 0.2
    assert m["divergence.excess_rate"].value is None
    assert "no replay pairs" in m["divergence.excess_rate"].detail


def test_large_days_sample_blocks_on_postgresql(store: Engine) -> None:
    records, _, _ = build()
    write_exchanges(store, records)
    window = (T0, T0 + timedelta(hours=4))
    config = DivergenceConfig(max_pairs_per_day=10)  # 100 pairs a day > 4 x 10
    first = analyze_divergence(store, DEP, window, config).to_dict()["candidate"]
    again = analyze_divergence(store, DEP, window, config).to_dict()["candidate"]
    assert first["pairs_total"] == N_PAIRS
    if store.dialect.name == "postgresql":  # TABLESAMPLE SYSTEM ... REPEATABLE
        assert 0 < first["pairs_sampled"] <= 20
    else:  # the smallest pair ids
        assert first["pairs_sampled"] == 20
    assert again == first  # reproducible


def test_postgresql_block_sample_spans_the_day(pg_engine: Engine) -> None:
    """TABLESAMPLE SYSTEM then LIMIT kept the first sampled blocks in table order (rows written
    in time order: the day's first hours); ordered by pair id it spans the whole day."""
    day = datetime(2026, 11, 2, tzinfo=UTC)
    n = 12_000
    pad = "lorem ipsum " * 30
    records = [
        exchange(
            deployment=DEP,
            role="candidate",
            engine="trtllm@candidate",
            pair_id=uuid.uuid4(),
            sent_at=day + timedelta(seconds=k * 86_400 / n),
            output_text=pad,
            request={"temperature": 0.0},
        )
        for k in range(n)
    ]
    for i in range(0, n, 200):  # batches in time order, as an ingester writes them
        write_exchanges(pg_engine, records[i : i + 200])
    sent = {r.pair_id: r.sent_at for r in records}

    def late_share(ids: list[Any]) -> float:
        return sum((sent[i] - day).total_seconds() >= 12 * 3600 for i in ids) / len(ids)

    lo, hi = day, day + timedelta(days=1)
    with pg_engine.connect() as conn:
        conn.exec_driver_sql("ANALYZE exchanges")
        ids = sample_pair_ids(conn, DEP, "candidate", lo, hi, 100, n)
        s = tablesample(EXCHANGES, func.system(2 * 100 / n * 100), name="s", seed=literal(7)).c
        unordered = conn.execute(
            select(s.pair_id).where(s.deployment == DEP, s.sent_at >= lo, s.sent_at < hi).limit(100)
        ).scalars()
        before = late_share(list(unordered))
    assert len(ids) == 100
    hours = sorted((sent[i] - day).total_seconds() / 3600 for i in ids)
    # ~10 blocks sampled, seeded by deployment and day (stable across looks): they fall in
    # both halves of the day, where the unordered sample kept the first hours only
    assert hours[0] < 12 <= hours[-1] and hours[-1] - hours[0] > 12, hours
    assert 0.2 < late_share(ids) < 0.8, hours
    assert before < 0.1  # the same block sample without the ordering: the day's first half
