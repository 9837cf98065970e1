"""Exchange rollups on PostgreSQL and SQLite: incident detection's input, the data extent and the
per-day counts read from the rollups equal what the raw rows give, and they are read from the
rollups (the rolled-up rows can be gone from ``exchanges``); thresholds below the floors fall
back to the raw rows."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from latency_factories import T0, pairs
from sqlalchemy import Engine, delete, func, select

from evaluator.exchange_rollups import STALL_FLOOR_S, closed_runs, role_extent
from evaluator.incidents.load import load_detection_input
from evaluator.incidents.model import DetectionInput, IncidentConfig
from evaluator.parity import load_parity
from evaluator.review import data_extent
from evaluator.rollups import refresh_rollups
from shadow_ab.records import ExchangeRecord
from storage.models import EXCHANGE_ROLLUP_HOURS, EXCHANGES, ExchangeNotable
from storage.partitions import ensure_partitions
from storage.write import write_exchanges

DEP = "dep-lat"
WINDOW = (T0 + timedelta(minutes=20), T0 + timedelta(hours=3, minutes=40))
NOW = T0 + timedelta(days=1)  # every hour closed


def _odd(role: str, at: timedelta, **fields: Any) -> ExchangeRecord:
    base: dict[str, Any] = {
        "deployment": DEP,
        "pair_id": uuid.uuid4(),
        "role": role,
        "engine": "vllm@incumbent" if role != "candidate" else "trtllm@candidate",
        "endpoint": "chat",
        "stream": True,
        "sent_at": T0 + at,
        "status": "ok",
    }
    return ExchangeRecord.model_validate({**base, **fields})


def _records() -> list[ExchangeRecord]:
    """Four hours of pairs (a candidate error every 7th), a burst of candidate errors, timeouts
    that name the shadow timeout, stalls above and below the threshold, an incumbent answer
    past the timeout, replays."""
    out = pairs(960, step=timedelta(seconds=15), cand_error_every=7)
    burst = timedelta(hours=1, minutes=10)
    out += [
        _odd("candidate", burst + timedelta(seconds=4 * i), status="http_error", http_status=503)
        for i in range(8)
    ]
    timeout_error = "no complete answer within 90.0s"
    out += [
        _odd("candidate", timedelta(hours=h, minutes=5), status="timeout", error=timeout_error)
        for h in (0, 2)
    ]
    out += [
        _odd("incumbent", timedelta(hours=2, minutes=31), ttft_s=12.0, e2e_s=13.0),  # stall
        _odd("incumbent", timedelta(hours=1, minutes=2), ttft_s=7.0, e2e_s=8.0),  # below 10 s
        _odd("candidate", timedelta(hours=3, minutes=1), ttft_s=0.1, e2e_s=15.0, itl_s=[11.0]),
        _odd("incumbent", timedelta(hours=1, minutes=50), ttft_s=0.1, e2e_s=100.0),  # > 90 s
        _odd("candidate", timedelta(minutes=30), status="connection_error", error="refused"),
        _odd("replay", timedelta(hours=2, minutes=12), status="http_error", http_status=500),
    ]
    out += [_odd("replay", timedelta(minutes=7 * i)) for i in range(30)]
    return out


@pytest.fixture
def loaded(store: Engine) -> Engine:
    if store.dialect.name == "postgresql":
        ensure_partitions(store, T0, days_ahead=2)
    records = _records()
    assert write_exchanges(store, records) == len(records)
    return store


def _plain(data: DetectionInput) -> dict[str, Any]:
    """The exchange side of a detection input, comparable with ==."""
    return {
        "events": sorted(data.events, key=lambda e: (e.sent_at, repr(e))),  # ties: any order
        "totals": data.sent.totals,
        "extent": data.sent.extent,
        "bins": {k: (a.tolist(), b.tolist()) for k, (a, b) in data.sent.bins.items()},
        "outcomes": data.outcomes,
        "outcomes_by_day": data.outcomes_by_day,
        "truncated": data.truncated,
        "timeout": data.shadow_timeout_s,
    }


def _drop_rolled_up_rows(engine: Engine) -> None:
    """Delete the raw rows of the rolled-up hours: what is read there must come from rollups."""
    with engine.connect() as conn:
        runs = closed_runs(conn, DEP, *WINDOW)
    assert runs == [(T0 + timedelta(hours=1), T0 + timedelta(hours=3))]
    x = EXCHANGES.c
    with engine.begin() as conn:
        for a, b in runs:
            conn.execute(delete(EXCHANGES).where(x.sent_at >= a, x.sent_at < b))


@pytest.mark.parametrize("max_events", [10_000, 5])
def test_detection_input_from_rollups_equals_raw(loaded: Engine, max_events: int) -> None:
    config = IncidentConfig()
    raw = _plain(load_detection_input(loaded, DEP, WINDOW, config, max_events=max_events))
    assert raw["timeout"] == 90.0
    assert raw["truncated"] == (max_events == 5)
    if not raw["truncated"]:  # the burst: per-minute counts were read around it
        assert raw["bins"] and any(e.ttft_s == 12.0 for e in raw["events"])
    refresh_rollups(loaded, DEP, WINDOW, now=NOW)
    _drop_rolled_up_rows(loaded)
    rolled = _plain(load_detection_input(loaded, DEP, WINDOW, config, max_events=max_events))
    assert rolled == raw


def test_notables_keep_what_detection_needs_only(loaded: Engine) -> None:
    refresh_rollups(loaded, DEP, WINDOW, now=NOW)
    with loaded.connect() as conn:
        notables = conn.execute(select(func.count()).select_from(ExchangeNotable)).scalar_one()
        hours = conn.execute(select(EXCHANGE_ROLLUP_HOURS)).all()
    # failures (every 7th of 960 candidates, the burst, timeouts, one connection error and one
    # replay error), the stalls, the long incumbent answer and the 7 s TTFT (above the floor)
    assert notables == 138 + 8 + 2 + 1 + 1 + 4
    assert {h.hour for h in hours} == {T0 + timedelta(hours=i) for i in range(4)}
    assert sum(h.n_notable for h in hours) == notables
    assert sum(h.n_exchanges for h in hours) == 960 * 2 + 8 + 2 + 6 + 30


def test_thresholds_below_the_floors_read_the_raw_rows(loaded: Engine) -> None:
    config = replace(IncidentConfig(), hang_stall_s=STALL_FLOOR_S / 2)
    raw = _plain(load_detection_input(loaded, DEP, WINDOW, config))
    refresh_rollups(loaded, DEP, WINDOW, now=NOW)
    assert _plain(load_detection_input(loaded, DEP, WINDOW, config)) == raw
    timeout = replace(IncidentConfig(), shadow_timeout_s=1.0)  # every answer censored
    raw = _plain(load_detection_input(loaded, DEP, WINDOW, timeout))
    assert raw["outcomes"]["incumbent"]["failed"] > 100  # answers of 1 s or longer
    assert _plain(load_detection_input(loaded, DEP, WINDOW, timeout)) == raw


def _extents(engine: Engine) -> list[Any]:
    spans = ((0, 60), (20, 180), (60, 240), (0, 300))  # minutes
    with engine.connect() as conn:
        per_role = [
            role_extent(conn, DEP, (role,), (T0 + timedelta(minutes=a), T0 + timedelta(minutes=b)))
            for role in ("incumbent", "candidate", "replay")
            for a, b in spans
        ]
    return [data_extent(engine, DEP, WINDOW), data_extent(engine, DEP), *per_role]


def test_extent_and_counts_from_rollups_equal_raw(loaded: Engine) -> None:
    raw = _extents(loaded)
    assert raw[0]["pairs"] > 0 and raw[1]["pairs"] == 960 + 8 + 2 + 2
    refresh_rollups(loaded, DEP, WINDOW, now=NOW)
    _drop_rolled_up_rows(loaded)
    assert _extents(loaded) == raw


def test_open_hours_are_read_raw_then_recomputed(loaded: Engine) -> None:
    everything = (T0, T0 + timedelta(hours=4))
    pairs_before = data_extent(loaded, DEP)["pairs"]
    refresh_rollups(loaded, DEP, everything, now=T0 + timedelta(hours=2, minutes=30))
    with loaded.connect() as conn:
        assert closed_runs(conn, DEP, *everything) == [(T0, T0 + timedelta(hours=2))]
    # a row written to an hour still open after the refresh counts
    assert write_exchanges(loaded, [_odd("candidate", timedelta(hours=2, minutes=40))]) == 1
    assert data_extent(loaded, DEP)["pairs"] == pairs_before + 1
    refresh_rollups(loaded, DEP, everything, now=NOW)
    with loaded.connect() as conn:
        assert closed_runs(conn, DEP, *everything) == [everything]
    assert data_extent(loaded, DEP)["pairs"] == pairs_before + 1


def test_load_parity_from_rollups_equals_raw(loaded: Engine) -> None:
    raw = load_parity(loaded, DEP, WINDOW)
    assert raw["by_load"] and raw["exchanges"]["replay"] > 0 and raw["guard_states"]
    refresh_rollups(loaded, DEP, WINDOW, now=NOW)
    _drop_rolled_up_rows(loaded)
    rolled = load_parity(loaded, DEP, WINDOW)
    assert rolled["exchanges"] == raw["exchanges"]
    assert rolled["guard_states"] == raw["guard_states"]
    assert [b["pairs"] for b in rolled["by_load"]] == [b["pairs"] for b in raw["by_load"]]
    for key in ("inflight_ratio", "shadow_share", "replay_share"):
        assert rolled[key] == pytest.approx(raw[key], rel=1e-12)
