"""build_review: the analyses in order, the verdict on their measurements, the stored review
(SQLite, the embedded default, and PostgreSQL), and errors that say what to do."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from factories import exchange
from review_factories import (
    T0,
    analyses,
    divergence_section,
    incident_section,
    latency_section,
)
from sqlalchemy import Engine, select, update

from evaluator.policy import default_policy
from evaluator.render import render
from evaluator.review import (
    SIMULATOR_NOTE,
    EmptyWindow,
    UnknownDeployment,
    build_review,
    data_extent,
    jsonable,
    resolve_window,
)
from shadow_ab.records import ExchangeRecord
from storage.models import Deployment, Report
from storage.write import write_exchanges

DEP = "llama3-trtllm"
WINDOW = (T0, T0 + timedelta(days=7))


def records(n_pairs: int = 20, days: float = 7.0) -> list[ExchangeRecord]:
    out = []
    for i in range(n_pairs):
        sent = T0 + timedelta(days=days * i / max(1, n_pairs - 1)) - timedelta(microseconds=1)
        sent = max(sent, T0)
        pair = uuid.uuid4()
        for role in ("incumbent", "candidate"):
            out.append(
                exchange(
                    deployment=DEP,
                    pair_id=pair,
                    role=role,
                    engine=f"e@{role}",
                    sent_at=sent,
                    ttft_s=0.04,
                    e2e_s=0.5,
                )
            )
    return out


def _fill(engine: Engine, hardware: str | None = None) -> None:
    write_exchanges(engine, records())
    with engine.begin() as conn:
        conn.execute(
            update(Deployment)
            .where(Deployment.name == DEP)
            .values(incumbent_engine="vllm", candidate_engine="trtllm", hardware=hardware)
        )


def test_review_runs_the_analyses_in_order_and_stores_the_report(sqlite_engine: Engine) -> None:
    _fill(sqlite_engine, hardware="simulated (shadow-ab sim, no GPU)")
    calls: list[str] = []
    incidents = incident_section(candidate_crashes=0)
    incidents.findings = ["crash-1"]
    progress: list[tuple[str, float]] = []
    review = build_review(
        sqlite_engine,
        DEP,
        WINDOW,
        default_policy().with_minimums(min_pairs=10, note="test minimums", horizon_days=7),
        lambda stage, f: progress.append((stage, f)),
        analyses=analyses(incidents=incidents, calls=calls),
    )
    # Incidents first; their restarts become latency's warm-up windows; then divergence, then
    # semantic similarity.
    assert calls == [
        "incidents",
        "latency warmup=['warmup-after-crash-1']",
        "divergence",
        "semantic",
    ]
    assert review.data["pairs"] == 20 and review.data["days"] == pytest.approx(7, abs=0.01)
    assert review.decision == "GO", review.verdict.reason
    assert SIMULATOR_NOTE in review.notes
    fractions = [f for _, f in progress]
    assert fractions == sorted(fractions) and fractions[-1] == pytest.approx(1.0)
    assert {s for s, _ in progress} >= {"incidents", "latency", "divergence", "render", "store"}
    assert set(review.timings) >= {"incidents", "latency", "divergence", "render", "store"}
    with sqlite_engine.connect() as conn:
        row = conn.execute(select(Report.__table__).where(Report.id == review.report_id)).one()
    assert row.verdict == "GO" and row.deployment == DEP
    assert row.body["verdict"]["decision"] == "GO"
    assert row.body["report_id"] == review.report_id
    assert row.body["sections"]["latency"]["plots"]["cdf"]["ttft"]["incumbent"]["values"]
    assert row.html is not None and "<svg" in row.html and ">GO<" in row.html
    # The stored body renders again without the database, in every format.
    assert "Migration review: llama3-trtllm" in render(row.body, "md")


def test_a_failing_criterion_is_no_go_with_its_reason(sqlite_engine: Engine) -> None:
    _fill(sqlite_engine)
    review = build_review(
        sqlite_engine,
        DEP,
        WINDOW,
        default_policy().with_minimums(min_pairs=10),
        analyses=analyses(latency=latency_section(slower_tail=True)),
        store=False,
    )
    assert review.decision == "NO-GO"
    assert "latency.e2e.spread_ratio" in review.verdict.reason
    assert review.report_id is None
    assert SIMULATOR_NOTE not in review.notes


def test_thin_data_is_inconclusive(sqlite_engine: Engine) -> None:
    _fill(sqlite_engine)
    review = build_review(
        sqlite_engine, DEP, WINDOW, default_policy(), analyses=analyses(), store=False
    )
    assert review.decision == "INCONCLUSIVE"
    assert "only 20 pairs; the policy asks for 1000" in review.verdict.reason


def test_unknown_deployment_lists_the_known_ones(sqlite_engine: Engine) -> None:
    _fill(sqlite_engine)
    with pytest.raises(UnknownDeployment, match=f"known deployments: {DEP}"):
        build_review(sqlite_engine, "nope", WINDOW, default_policy(), analyses=analyses())


def test_empty_window_says_so(sqlite_engine: Engine) -> None:
    _fill(sqlite_engine)
    later = (T0 + timedelta(days=30), T0 + timedelta(days=31))
    with pytest.raises(EmptyWindow, match="no mirrored pairs between"):
        build_review(sqlite_engine, DEP, later, default_policy(), analyses=analyses())


def test_default_window_covers_all_the_data(sqlite_engine: Engine) -> None:
    _fill(sqlite_engine)
    start, end = resolve_window(sqlite_engine, DEP)
    assert start == T0 and timedelta(days=6.99) < end - start <= timedelta(days=7, seconds=1)
    only_incumbent = records(1)[0].model_copy(update={"deployment": "x"})
    write_exchanges(sqlite_engine, [only_incumbent])
    with pytest.raises(EmptyWindow, match="no mirrored exchanges yet"):
        resolve_window(sqlite_engine, "x")


def test_default_window_keeps_the_last_pairs_replay(sqlite_engine: Engine) -> None:
    """The mirror sends a pair's incumbent, then its candidate, then its replay, microseconds
    apart; the default window must still hold the last pair's replay (a window ending just
    after the last candidate left it out: on real vLLM, 49 of 50 replays were judged)."""
    pair = uuid.uuid4()
    sent = {"incumbent": T0, "candidate": T0 + timedelta(microseconds=40)}
    sent["replay"] = sent["candidate"] + timedelta(microseconds=60)
    write_exchanges(
        sqlite_engine,
        [
            exchange(deployment=DEP, pair_id=pair, role=role, engine=f"e@{role}", sent_at=at)
            for role, at in sent.items()
        ],
    )
    start, end = resolve_window(sqlite_engine, DEP)
    assert start == sent["candidate"] and sent["replay"] < end
    assert end - sent["replay"] == timedelta(microseconds=1)


def test_three_days_of_data_count_three_days(sqlite_engine: Engine) -> None:
    # Pairs every 10 minutes over exactly three days, the first 5 minutes
    # after the window's start and the last 5 minutes before its end: 2.993 days apart, which
    # a data.days >= 3 check failed at the day-3 look.
    pairs = [T0 + timedelta(minutes=5 + 10 * k) for k in range(3 * 24 * 6)]  # 00:05 .. day 3 23:55
    out = []
    for k, sent in enumerate(pairs):
        for role in ("incumbent", "candidate"):
            out.append(
                ExchangeRecord(
                    deployment=DEP,
                    pair_id=uuid.UUID(int=k + 1),
                    role=role,
                    engine=f"e@{role}",
                    endpoint="chat",
                    stream=True,
                    sent_at=sent,
                    status="ok",
                    ttft_s=0.04,
                    e2e_s=0.5,
                )
            )
    write_exchanges(sqlite_engine, out)
    three_days = (T0, T0 + timedelta(days=3))
    assert data_extent(sqlite_engine, DEP, three_days)["days"] == 3.0
    assert data_extent(sqlite_engine, DEP, resolve_window(sqlite_engine, DEP))["days"] == 3.0
    policy = default_policy().with_minimums(min_pairs=10, min_days=3.0, horizon_days=3.0)
    review = build_review(sqlite_engine, DEP, three_days, policy, analyses=analyses(), store=False)
    assert review.decision == "GO", review.verdict.reason
    days = next(m for m in review.measurements if m.key == "data.days")
    assert days.value == 3.0 and "UTC hours" in (days.detail or "")
    # Two and a half days are not three: hours are counted whole, not rounded up to days.
    half = (T0, T0 + timedelta(days=2.5))
    assert data_extent(sqlite_engine, DEP, half)["days"] == 2.5
    short = build_review(sqlite_engine, DEP, half, policy, analyses=analyses(), store=False)
    assert short.decision == "INCONCLUSIVE" and "days" in short.verdict.reason


def test_jsonable_is_strict_json() -> None:
    import numpy as np

    body = jsonable({"a": float("nan"), "b": float("inf"), "c": np.float64(1.5), "d": (1, 2)})
    assert body == {"a": None, "b": "inf", "c": 1.5, "d": [1, 2]}


def test_report_stored_on_postgresql(pg_engine: Engine) -> None:
    """jsonb refuses NaN and Infinity: the body (with an infinite interval) still goes in."""
    _fill(pg_engine)
    review = build_review(
        pg_engine,
        DEP,
        WINDOW,
        default_policy().with_minimums(min_pairs=10),
        analyses=analyses(
            incidents=incident_section(candidate_crashes=2),
            divergence=divergence_section(excess=0.05),
        ),
    )
    assert review.decision == "NO-GO"
    with pg_engine.connect() as conn:
        row = conn.execute(select(Report.__table__).where(Report.id == review.report_id)).one()
    crash = next(
        r
        for r in row.body["verdict"]["criteria"]
        if r["criterion"]["key"] == "incidents.crash.rate_ratio"
    )
    assert crash["measurement"]["interval"]["high"] == "inf"
    assert crash["outcome"] == "INCONCLUSIVE"
    assert row.html and "NO-GO" in row.html


def _month(engine: Engine, days: int) -> None:
    """A pair every hour over ``days`` days of one deployment, from T0."""
    out = []
    for k in range(days * 24):
        pair = uuid.uuid4()
        for role in ("incumbent", "candidate"):
            out.append(
                exchange(
                    deployment=DEP,
                    pair_id=pair,
                    role=role,
                    engine=f"e@{role}",
                    sent_at=T0 + timedelta(hours=k, minutes=5),
                )
            )
    write_exchanges(engine, out)


def test_a_later_window_is_the_same_look_of_the_deployments_plan(sqlite_engine: Engine) -> None:
    """Looks count days from the deployment's start: a review from day 10 (``--from``) is the
    day-20 look of the plan, as the review of the whole window is, not look 10 of a new plan
    (which would spend a fresh budget of alpha at every restarted plan)."""
    _month(sqlite_engine, 20)
    policy = default_policy().with_minimums(min_pairs=10, min_days=1)
    end = T0 + timedelta(days=20)
    whole = build_review(sqlite_engine, DEP, (T0, end), policy, analyses=analyses(), store=False)
    later = build_review(
        sqlite_engine,
        DEP,
        (T0 + timedelta(days=10), end),
        policy,
        analyses=analyses(),
        store=False,
    )
    assert whole.verdict.look is not None and later.verdict.look is not None
    assert whole.verdict.look.look == 20
    assert later.verdict.look.look == whole.verdict.look.look
    assert later.verdict.look.level == whole.verdict.look.level
    assert later.data["days"] == pytest.approx(10, abs=0.01)  # the window's own data
    assert later.data["plan"]["look"] == 20 and later.data["plan"]["days"] == 20
    assert any("counted from the deployment's start" in n for n in later.notes)
    # A stored start earlier than the first pair counts from it.
    with sqlite_engine.begin() as conn:
        conn.execute(
            update(Deployment)
            .where(Deployment.name == DEP)
            .values(started_at=T0 - timedelta(days=2))
        )
    earlier = build_review(
        sqlite_engine, DEP, (T0 + timedelta(days=10), end), policy, analyses=analyses(), store=False
    )
    assert earlier.verdict.look is not None and earlier.verdict.look.look == 22


def test_a_review_past_the_horizon_says_so_and_spends_nothing_more(sqlite_engine: Engine) -> None:
    """Day 40 of a 30-day plan: the verdict and the notes say it is past the horizon, in plain
    words; the look spends no alpha (its boundary is the horizon's), where day 30 spent its
    last share."""
    _month(sqlite_engine, 40)
    policy = default_policy().with_minimums(min_pairs=10, min_days=1, horizon_days=30)
    last_week = (T0 + timedelta(days=33), T0 + timedelta(days=40))
    review = build_review(sqlite_engine, DEP, last_week, policy, analyses=analyses(), store=False)
    look = review.verdict.look
    assert look is not None and look.past_horizon and look.days == pytest.approx(40)
    at_horizon = policy.look(30.0)
    assert at_horizon.spends > 0 and look.spends == 0.0
    assert look.z == at_horizon.z and look.spent == pytest.approx(look.alpha)
    assert at_horizon.spent == pytest.approx(look.alpha)
    assert "past the planned horizon" in review.verdict.reason
    assert "spends none more" in review.verdict.reason
    assert any("past the planned horizon" in n for n in review.notes)
    assert review.to_dict()["verdict"]["look"]["spends"] == 0.0
