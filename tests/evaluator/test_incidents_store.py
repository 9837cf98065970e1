"""Incidents through the store (SQLite and PostgreSQL): detect, store once, query, compare."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from factories import exchange, health
from sqlalchemy import Engine, func, select

from evaluator.incidents.analysis import IncidentSection, detect_incidents
from evaluator.incidents.leak import MB
from evaluator.incidents.load import load_detection_input
from evaluator.incidents.model import Finding, Window
from evaluator.incidents.query import (
    BadQuery,
    UnknownDeployment,
    compare_incidents,
    query_incidents,
)
from evaluator.incidents.store import INCIDENTS, store_incidents
from evaluator.review import default_analyses
from shadow_ab.records import ExchangeRecord, HealthSample
from storage.write import write_exchanges, write_health

T0 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
PST = 1_796_000_000.0
HOURS = 12
STEP_S = 30
CRASH_AT_S = 8 * 3600
LEAK_MB_H = 120.0
DEP = "dep-inc"


def health_samples(
    *, leak: bool = True, crash: bool = True, deployment: str = DEP
) -> list[HealthSample]:
    """12 h of scrapes every 30 s of both engines. The candidate (TensorRT-LLM flavor) leaks GPU
    memory at LEAK_MB_H and crashes once at 8 h (a minute refusing connections, then a new
    process whose memory starts over); the incumbent is clean."""
    out = []
    for i in range(HOURS * 3600 // STEP_S):
        t = i * STEP_S
        ts = T0 + timedelta(seconds=t)
        out.append(
            health(
                deployment=deployment,
                role="incumbent",
                flavor="vllm",
                ts=ts,
                http_status=200,
                latency_s=0.002,
                version="0.11.0",
                process_start_time=PST,
                cpu_mem_bytes=int(6_000 * MB + (i % 7) * MB),
            )
        )
        restarted = crash and t >= CRASH_AT_S
        since = t - CRASH_AT_S if restarted else t
        down = crash and CRASH_AT_S - 60 <= t < CRASH_AT_S
        out.append(
            health(
                deployment=deployment,
                role="candidate",
                flavor="trtllm",
                ts=ts,
                up=not down,
                http_status=None if down else 200,
                error="connection refused" if down else None,
                latency_s=None if down else 0.003,
                version="1.1.0",
                process_start_time=None if down else (PST + CRASH_AT_S if restarted else PST),
                gpu_mem_bytes=None
                if down
                else int(70_000 * MB + (since / 3600 * LEAK_MB_H * MB if leak else (i % 5) * MB)),
            )
        )
    return out


def exchanges(*, crash: bool = True, deployment: str = DEP) -> list[ExchangeRecord]:
    """A pair every 60 s; the candidate's requests during the crash minute are refused."""
    out = []
    for k in range(HOURS * 60):
        t = k * 60
        pid = uuid.UUID(int=k + 1)
        sent = T0 + timedelta(seconds=t)
        for role in ("incumbent", "candidate"):
            down = crash and role == "candidate" and CRASH_AT_S - 60 <= t < CRASH_AT_S
            fields: dict[str, Any] = {
                "deployment": deployment,
                "pair_id": pid,
                "role": role,
                "sent_at": sent,
                "status": "connection_error" if down else "ok",
                "error": "connection refused" if down else None,
                "request": {"temperature": 0.0, "max_tokens": 8},
            }
            if not down:
                fields.update(
                    http_status=200,
                    ttft_s=0.04,
                    e2e_s=0.2,
                    itl_s=[0.02] * 7,
                    completion_tokens=8,
                    finish_reason="length",
                    output_text="a b c d e f g h",
                )
            out.append(exchange(**fields))
    return out


WINDOW = (T0, T0 + timedelta(hours=HOURS))


def review_incidents(store: Engine, window: Window, **kw: Any) -> IncidentSection:
    """What the review runs: load, detect, store, and the section."""
    section = default_analyses().incidents(store, DEP, window, **kw)
    assert isinstance(section, IncidentSection)
    return section


def detected(store: Engine, window: Window) -> list[Finding]:
    return detect_incidents(load_detection_input(store, DEP, window))


def test_leak_and_restart_found_stored_once_and_compared(store: Engine) -> None:
    write_health(store, health_samples())
    write_exchanges(store, exchanges())
    stages: list[str] = []
    section = review_incidents(store, WINDOW, progress=lambda s, f: stages.append(s))
    assert stages[-1] == "incidents done"
    found = [(f.role, f.kind) for f in section.findings]
    assert sorted(found) == [("candidate", "crash"), ("candidate", "leak")]
    crash = next(f for f in section.findings if f.kind == "crash")
    assert crash.evidence["connection_errors"] == 1
    leak = next(f for f in section.findings if f.kind == "leak")
    assert leak.evidence["mb_per_hour"] == pytest.approx(LEAK_MB_H, rel=0.2)

    m = {x.key: x for x in section.measurements()}
    assert m["incidents.crash.candidate_count"].value == 1
    assert m["incidents.leak.candidate_mb_per_hour"].value == pytest.approx(LEAK_MB_H, rel=0.2)
    assert m["incidents.crash.rate_ratio"].value == float("inf")
    assert m["incidents.hang.rate_ratio"].value is None  # 0 vs 0: nothing to compare
    assert m["errors.rate_ratio"].value == float("inf")  # 1 refused vs none
    assert section.exposure_days["candidate"] == pytest.approx(HOURS / 24, rel=0.02)
    d = section.to_dict()
    assert d["counts"]["candidate"]["crash"] == 1 and d["counts"]["incumbent"]["crash"] == 0
    assert [r["bucket"] for r in d["per_day"]] == ["2026-11-30"]
    assert d["per_day"][0]["candidate"]["total"] == 2
    assert len(d["timeline"]) == 2 and d["stored_new"] == 2

    # Idempotent: the same window, then a wider one, add nothing.
    again = review_incidents(store, WINDOW)
    assert again.stored_new == 0
    wider = detected(store, (T0 - timedelta(hours=1), WINDOW[1]))
    assert store_incidents(store, DEP, wider) == 0
    with store.connect() as conn:
        assert conn.execute(select(func.count()).select_from(INCIDENTS)).scalar_one() == 2

    rows = query_incidents(store, DEP)
    assert [r["kind"] for r in rows] == ["leak", "crash"]
    assert rows[1]["role"] == "candidate" and rows[1]["duration_s"] > 0
    assert query_incidents(store, DEP, engine_role="incumbent") == []
    assert len(query_incidents(store, DEP, engine_role="trtllm@candidate", kind="crash")) == 1
    later = query_incidents(store, DEP, since=T0 + timedelta(hours=4))
    assert [r["kind"] for r in later] == ["crash"]

    cmp = compare_incidents(store, DEP, by="week", since=WINDOW[0], until=WINDOW[1])
    assert cmp["roles"]["candidate"]["count"] == 2
    assert cmp["roles"]["incumbent"]["exposure_days"] == pytest.approx(HOURS / 24, rel=0.02)
    assert cmp["comparison"]["unbounded"] is True
    assert cmp["comparison"]["interval"]["low"] > 0
    assert [b["bucket"] for b in cmp["buckets"]] == ["2026-W49"]
    by_kind = compare_incidents(store, DEP, by="day", kind="crash")
    assert by_kind["roles"]["candidate"]["counts"] == {"crash": 1}


def test_a_a_run_has_no_incidents(store: Engine) -> None:
    write_health(store, health_samples(leak=False, crash=False))
    write_exchanges(store, exchanges(crash=False))
    section = review_incidents(store, WINDOW)
    assert section.findings == []
    m = {x.key: x for x in section.measurements()}
    assert m["errors.rate_ratio"].value is None  # no failures on either side
    leak = m["incidents.leak.candidate_mb_per_hour"]
    assert leak.value is not None and leak.interval is not None
    assert abs(leak.value) < 5 and "no sustained leak" in leak.detail
    assert query_incidents(store, DEP) == []


def test_unknown_deployment_and_bad_arguments(store: Engine) -> None:
    write_health(store, health_samples(leak=False, crash=False)[:10])
    with pytest.raises(UnknownDeployment) as err:
        query_incidents(store, "nope")
    assert err.value.known == [DEP] and DEP in str(err.value)
    with pytest.raises(BadQuery, match="kind"):
        query_incidents(store, DEP, kind="meltdown")
    with pytest.raises(BadQuery, match="timezone"):
        query_incidents(store, DEP, since=datetime(2026, 11, 30))
    with pytest.raises(BadQuery, match="--by"):
        compare_incidents(store, DEP, by="month")  # type: ignore[arg-type]  # the point


def test_trtllm_restart_seen_only_in_its_iteration_counter(store: Engine) -> None:
    samples = []
    for i in range(240):
        ts = T0 + timedelta(seconds=i * 15)
        restarted = i >= 150
        samples.append(
            health(
                deployment=DEP,
                role="candidate",
                flavor="trtllm",
                ts=ts,
                http_status=200,
                latency_s=6.0 if i == 140 else 0.003,  # a slow scrape shortly before
                version="1.1.0",
                gpu_mem_bytes=int(70_000 * MB),
                metrics={"iter": float((i - 150) * 3 if restarted else 1_000 + i * 40)},
            )
        )
    write_health(store, samples)
    found = detected(store, (T0, T0 + timedelta(hours=1)))
    assert sorted((f.kind, f.started_at) for f in found) == [
        ("crash", T0 + timedelta(seconds=149 * 15)),
        ("hang", T0 + timedelta(seconds=140 * 15)),
    ]


def test_store_merges_the_same_incident_not_a_later_one(store: Engine) -> None:
    eng, t = "trtllm@candidate", T0
    still_down = Finding(eng, "candidate", "crash", t, None, {"still_down_at": str(t)})
    assert store_incidents(store, DEP, [still_down]) == 1
    closed = Finding(eng, "candidate", "crash", t, t + timedelta(minutes=2), {"down_samples": 8})
    later = Finding(eng, "candidate", "crash", t + timedelta(hours=2), t + timedelta(hours=2.1))
    assert store_incidents(store, DEP, [closed, later]) == 1  # the first one closed, one new
    rows = query_incidents(store, DEP)
    assert [(r["started_at"], r["duration_s"]) for r in rows] == [
        (t.isoformat(), 120.0),
        ((t + timedelta(hours=2)).isoformat(), 360.0),
    ]
    assert rows[0]["evidence"]["down_samples"] == 8


def test_default_window_counts_an_incident_at_the_last_data_point(store: Engine) -> None:
    samples = health_samples(leak=False, crash=False)[:20]
    write_health(store, samples)
    last = max(s.ts for s in samples)
    # The latest thing the deployment holds is this incident's start.
    store_incidents(store, DEP, [Finding("trtllm@candidate", "candidate", "hang", last, None, {})])
    cmp = compare_incidents(store, DEP, by="day")  # no since/until: the data's own span
    assert cmp["roles"]["candidate"]["count"] == 1
    assert sum(b["candidate"]["total"] for b in cmp["buckets"]) == 1


def test_restart_faster_than_a_scrape_is_dated_from_the_sample_before_it(store: Engine) -> None:
    # Four days of scrapes a minute apart. The candidate (vLLM) crashes on
    # day 1 (two minutes refusing connections) and restarts on day 3 faster than a scrape: the
    # only sign is a new process start time. The loader passes only the health rows where
    # something changed; the restart used to be dated from the previous change (day 1), so it
    # swallowed the hangs of day 2 and was merged into the first crash's stored row.
    start = datetime(2026, 10, 12, 0, 0, 30, tzinfo=UTC)
    step = timedelta(minutes=1)
    crash_at, fast_at = start + timedelta(days=1, hours=10), start + timedelta(days=3, hours=18)
    samples = []
    for i in range(4 * 24 * 60):
        ts = start + i * step
        down = crash_at <= ts < crash_at + 2 * step
        pst = PST + (ts >= crash_at) * 86400.0 + (ts >= fast_at) * 86400.0
        for role, engine in (("incumbent", "vllm@incumbent"), ("candidate", "vllm@candidate")):
            off = down and role == "candidate"
            samples.append(
                HealthSample(
                    deployment=DEP,
                    engine=engine,
                    role=role,
                    flavor="vllm",
                    ts=ts,
                    up=not off,
                    http_status=None if off else 200,
                    error="connection refused" if off else None,
                    version="0.11.0",
                    process_start_time=None if off else (pst if role == "candidate" else PST),
                    cpu_mem_bytes=None if off else int(6_000 * MB + (i % 7) * MB),
                )
            )
    write_health(store, samples)
    hang_times = [start + timedelta(days=2, hours=h) for h in (9, 14, 20)]
    records = []
    for k in range(4 * 24 * 6):  # a pair every 10 minutes
        sent = start + timedelta(minutes=10 * k, seconds=5)
        pid = uuid.UUID(int=10_000 + k)
        for role, engine in (("incumbent", "vllm@incumbent"), ("candidate", "vllm@candidate")):
            records.append(
                ExchangeRecord(
                    deployment=DEP,
                    pair_id=pid,
                    role=role,
                    engine=engine,
                    endpoint="chat",
                    stream=True,
                    sent_at=sent,
                    status="ok",
                    http_status=200,
                    ttft_s=0.04,
                    e2e_s=0.2,
                )
            )
    for k, sent in enumerate(hang_times):  # the candidate times out, three times on day 2
        records.append(
            ExchangeRecord(
                deployment=DEP,
                pair_id=uuid.UUID(int=20_000 + k),
                role="candidate",
                engine="vllm@candidate",
                endpoint="chat",
                stream=True,
                sent_at=sent,
                status="timeout",
                error="timed out after 120 s",
            )
        )
    write_exchanges(store, records)

    section = review_incidents(store, (start, start + timedelta(days=4)))
    crashes = sorted((f for f in section.findings if f.kind == "crash"), key=lambda f: f.started_at)
    assert [c.role for c in crashes] == ["candidate", "candidate"]
    fast = crashes[1]
    assert fast.ended_at == fast_at and fast.started_at == fast_at - step  # one scrape long
    assert fast.evidence["down_samples"] == 0
    assert crashes[0].started_at == crash_at and crashes[0].ended_at == crash_at + 2 * step
    hangs = sorted(f.started_at for f in section.findings if f.kind == "hang")
    assert hangs == hang_times  # none swallowed by a crash
    assert {f.kind for f in section.findings} == {"crash", "hang"}
    m = {x.key: x for x in section.measurements()}
    assert m["incidents.crash.candidate_count"].value == 2
    assert m["incidents.hang.candidate_count"].value == 3
    with store.connect() as conn:
        stored = conn.execute(
            select(INCIDENTS.c.kind, func.count()).group_by(INCIDENTS.c.kind)
        ).all()
    assert dict((k, n) for k, n in stored) == {"crash": 2, "hang": 3}  # rows = the report's
