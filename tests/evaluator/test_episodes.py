"""Incidents and failures counted by their unit of independence: episodes, overdispersion, and
both roles censored at the shadow timeout."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import numpy as np
from factories import exchange
from sqlalchemy import Engine

from evaluator.incidents.analysis import episodes, failure_comparison
from evaluator.incidents.load import load_detection_input
from evaluator.incidents.model import DetectionInput, Finding
from evaluator.rates import compare_dispersed_rates, compare_poisson_rates, dispersion
from storage.write import write_exchanges

T0 = datetime(2026, 3, 2, tzinfo=UTC)


def _bursty_days(rng: np.random.Generator, days: int, sent: int) -> tuple[list[float], list[float]]:
    """Failures per day: a baseline share of 0.1 % plus error bursts (0.15 a day, ~20 failures
    each, Poisson)."""
    base = rng.poisson(0.001 * sent, days)
    bursts = rng.poisson(0.15, days)
    extra = np.array([rng.poisson(20, b).sum() for b in bursts])
    return (base + extra).astype(float).tolist(), [float(sent)] * days


def test_a_a_bursty_failures_rarely_fail_once_overdispersion_is_counted() -> None:
    """Identical engines with error bursts, looked at on days 3..30: the plain Poisson test
    fails errors.rate_ratio <= 1.5 at some look in about a third of the months (measured:
    34 % of 200), the overdispersed one in about 2 %."""
    rng = np.random.default_rng(11)
    months, looks = 200, (3, 5, 7, 10, 14, 21, 30)
    plain_any = dispersed_any = 0
    for _ in range(months):
        x1, t1 = _bursty_days(rng, 30, 2000)
        x2, t2 = _bursty_days(rng, 30, 2000)
        plain_fail = dispersed_fail = False
        for k in looks:
            plain = compare_poisson_rates(
                round(sum(x1[:k])), sum(t1[:k]), round(sum(x2[:k])), sum(t2[:k])
            )
            dispersed = compare_dispersed_rates(x1[:k], t1[:k], x2[:k], t2[:k])
            assert dispersed.dispersion >= 1.0
            assert dispersed.interval.low <= plain.interval.low + 1e-9
            plain_fail |= plain.interval.low > 1.5
            dispersed_fail |= dispersed.interval.low > 1.5
        plain_any += plain_fail
        dispersed_any += dispersed_fail
    assert dispersed_any / months <= 0.06, (plain_any, dispersed_any)
    assert plain_any / months >= 0.15, (plain_any, dispersed_any)


def test_a_real_tripling_of_failures_is_still_seen() -> None:
    rng = np.random.default_rng(12)
    seen = 0
    for _ in range(100):
        x1 = rng.poisson(0.006 * 10_000, 30).astype(float).tolist()  # 3x, no bursts
        x2 = rng.poisson(0.002 * 10_000, 30).astype(float).tolist()
        t = [10_000.0] * 30
        seen += compare_dispersed_rates(x1, t, x2, t).interval.low > 1.5
    assert seen >= 95


def test_poisson_counts_keep_the_exact_test() -> None:
    """phi 1: the exact test on the counts themselves, at Student's t tail on phi's degrees of
    freedom (4 here: wider than the exact interval, which it holds); from one day (nothing to
    estimate phi on) exactly the exact test."""
    assert dispersion([[3, 3, 3]], [[1, 1, 1]]) == (1.0, 2)
    a = compare_dispersed_rates([1, 2, 1], [1, 1, 1], [2, 1, 2], [1, 1, 1], level=0.9)
    b = compare_poisson_rates(4, 3.0, 5, 3.0, level=0.9)
    assert a.dispersion == 1.0 and a.dispersion_df == 4 and a.p_value == b.p_value
    assert a.interval.low < b.interval.low and a.interval.high > b.interval.high
    one = compare_dispersed_rates([4], [3.0], [5], [3.0], level=0.9)
    assert one.interval == b.interval and one.dispersion_df == 0
    assert compare_dispersed_rates([0, 40, 0], [1, 1, 1], [1, 1, 2], [1, 1, 1]).dispersion > 5


def _crash(role: str, at: datetime) -> Finding:
    return Finding(f"e@{role}", role, "crash", at, at + timedelta(seconds=30))


def test_a_crash_loop_is_one_episode() -> None:
    loop = [_crash("candidate", T0 + timedelta(minutes=3 * i)) for i in range(8)]
    later = [_crash("candidate", T0 + timedelta(hours=5))]
    other = [_crash("incumbent", T0 + timedelta(minutes=1))]
    eps = episodes(loop + later + other, gap_s=1800.0)
    cand = [e for e in eps if e.role == "candidate"]
    assert [e.evidence["episode_incidents"] for e in cand] == [8, 1]
    assert len([e for e in eps if e.role == "incumbent"]) == 1


def test_failure_comparison_uses_per_day_counts() -> None:
    data = DetectionInput(
        health=[],
        outcomes={
            "candidate": {"sent": 3000, "failed": 43},
            "incumbent": {"sent": 3000, "failed": 3},
        },
        outcomes_by_day={
            "candidate": {1: (1000, 1), 2: (1000, 41), 3: (1000, 1)},
            "incumbent": {1: (1000, 1), 2: (1000, 1), 3: (1000, 1)},
        },
    )
    c = failure_comparison(data, 0.95)
    assert c is not None and c.dispersion > 5 and c.interval.low < 1.5
    data.outcomes_by_day = None
    plain = failure_comparison(data, 0.95)
    assert plain is not None and plain.dispersion == 1.0 and plain.interval.low > 1.5


def test_both_roles_are_censored_at_the_shadow_timeout(store: Engine) -> None:
    """A generation longer than the shadow timeout: the candidate is cut there (a timeout), the
    incumbent, which the mirror never cuts, ran on. Both count as the same timeout."""
    dep = "dep-censor"
    records = []
    for i in range(20):
        pid = uuid.uuid4()
        at = T0 + timedelta(minutes=i)
        long = i % 5 == 0
        records.append(
            exchange(
                deployment=dep, pair_id=pid, sent_at=at, ttft_s=0.05, e2e_s=150.0 if long else 2.0
            )
        )
        if long:
            records.append(
                exchange(
                    deployment=dep,
                    pair_id=pid,
                    role="candidate",
                    sent_at=at,
                    status="timeout",
                    error="no complete answer within 90.0s",
                )
            )
        else:
            records.append(
                exchange(deployment=dep, pair_id=pid, role="candidate", sent_at=at, e2e_s=1.8)
            )
    write_exchanges(store, records)
    data = load_detection_input(store, dep, (T0, T0 + timedelta(hours=1)))
    assert data.shadow_timeout_s == 90.0
    assert data.outcomes is not None
    assert data.outcomes["candidate"]["failed"] == data.outcomes["incumbent"]["failed"] == 4
    censored = [e for e in data.events if e.role == "incumbent"]
    assert len(censored) == 4 and all(e.status == "timeout" for e in censored)
    c = failure_comparison(data, 0.95)
    assert c is not None and c.ratio == 1.0


def test_incidents_before_and_after_each_upgrade() -> None:
    from evaluator.incidents.upgrades import upgrade_table

    change = Finding(
        "e@candidate",
        "candidate",
        "version_change",
        T0 + timedelta(days=2),
        T0 + timedelta(days=2, minutes=1),
        {"from_version": "1.0", "to_version": "1.1", "restart": True},
    )
    crashes = [_crash("candidate", T0 + timedelta(days=2, hours=3 * i)) for i in range(1, 9)]
    findings = [change, *crashes, _crash("candidate", T0 + timedelta(hours=5))]
    eps = episodes(findings, 1800.0)
    lo, hi = T0, T0 + timedelta(days=4)
    exposure = {"candidate": [(lo.timestamp(), hi.timestamp())]}
    by_day = {
        "candidate": {int(lo.timestamp() // 86400) + d: (1000, 1 + 9 * (d >= 2)) for d in range(4)}
    }
    rows = upgrade_table(findings, eps, exposure, (lo, hi), by_day, 0.9)
    assert len(rows) == 1
    row = rows[0]
    assert (row["from_version"], row["to_version"], row["role"]) == ("1.0", "1.1", "candidate")
    assert row["before"]["episodes"]["crash"] == 1 and row["after"]["episodes"]["crash"] == 8
    assert row["incidents_after_vs_before"]["interval"]["level"] == 0.9
    assert row["incidents_after_vs_before"]["interval"]["low"] > 1.0
    # whole UTC days on each side: the day of the change counts on neither
    assert row["failures"]["after"]["failed"] == 10 and row["failures"]["before"]["failed"] == 2
    assert row["failures"]["comparison"]["interval"]["low"] > 1.0
