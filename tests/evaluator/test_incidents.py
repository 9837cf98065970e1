"""Incident detection on plain values: restarts, version changes, outages, bursts, hangs, leaks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from evaluator.incidents.analysis import detect_incidents
from evaluator.incidents.leak import MB
from evaluator.incidents.model import (
    DetectionInput,
    ExchangeEvent,
    HealthPoint,
    IncidentConfig,
    SentCounts,
)
from evaluator.incidents.restarts import detect_restarts, warmup_windows
from shadow_ab.records import ANSWER_TRUNCATED

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
PST = 1_796_000_000.0


def hp(i: int, *, engine: str = "trt@candidate", step_s: float = 15.0, **kw: Any) -> HealthPoint:
    fields: dict[str, Any] = {
        "engine": engine,
        "role": "candidate" if "candidate" in engine else "incumbent",
        "ts": T0 + timedelta(seconds=i * step_s),
        "up": True,
        "http_status": 200,
        "latency_s": 0.002,
        "version": "1.1.0",
        "process_start_time": PST,
        "gpu_mem_bytes": int(70_000 * MB),
        "cpu_mem_bytes": int(6_000 * MB),
    }
    fields.update(kw)
    return HealthPoint(**fields)


def refused(i: int, **kw: Any) -> HealthPoint:
    return hp(i, up=False, http_status=None, error="connection refused", latency_s=None, **kw)


def series(n: int, **kw: Any) -> list[HealthPoint]:
    return [hp(i, **kw) for i in range(n)]


def kinds(findings: list[Any]) -> list[str]:
    return [f.kind for f in findings]


def test_clean_engines_have_no_incidents() -> None:
    data = DetectionInput(health=series(400) + series(400, engine="vllm@incumbent"))
    assert detect_incidents(data) == []


def test_restart_is_exactly_one_crash() -> None:
    pts = series(100)
    pts += [refused(i) for i in range(100, 104)]
    pts += [hp(i, process_start_time=PST + 1600) for i in range(104, 200)]
    found = detect_restarts(pts)
    assert kinds(found) == ["crash"]
    crash = found[0]
    assert crash.started_at == T0 + timedelta(seconds=1500)
    assert crash.ended_at == T0 + timedelta(seconds=104 * 15)
    assert crash.evidence["new_process_start_time"] == PST + 1600
    assert crash.evidence["down_samples"] == 4


def test_restart_between_scrapes_still_counts() -> None:
    pts = series(10) + [hp(i, process_start_time=PST + 500) for i in range(10, 20)]
    assert kinds(detect_restarts(pts)) == ["crash"]


def test_first_start_is_not_a_crash() -> None:
    pts = [refused(i) for i in range(4)] + [hp(i) for i in range(4, 20)]
    assert detect_restarts(pts) == []


def test_version_change_with_and_without_restart() -> None:
    plain = series(10) + [hp(i, version="1.2.0") for i in range(10, 20)]
    found = detect_restarts(plain)
    assert kinds(found) == ["version_change"]
    assert found[0].evidence == {
        "source": "health",
        "from_version": "1.1.0",
        "to_version": "1.2.0",
        "restart": False,
    }
    restarting = [*series(10), refused(10), refused(11)]
    restarting += [hp(i, version="1.2.0", process_start_time=PST + 200) for i in range(12, 20)]
    found = detect_restarts(restarting)
    assert kinds(found) == ["version_change"]  # one incident, not also a crash
    assert found[0].evidence["restart"] is True


def test_health_503_from_a_live_process_is_not_a_crash() -> None:
    pts = series(10) + [hp(i, up=False, http_status=503) for i in range(10, 14)] + series(20)[14:]
    assert kinds(detect_restarts(pts)) == ["error_burst"]


def test_without_process_start_time_refused_health_means_restart() -> None:
    pts = [hp(i, process_start_time=None) for i in range(10)]
    pts += [refused(i, process_start_time=None) for i in range(10, 13)]
    pts += [hp(i, process_start_time=None) for i in range(13, 20)]
    assert kinds(detect_restarts(pts)) == ["crash"]


def test_engine_down_at_the_end_is_an_open_crash() -> None:
    pts = series(10) + [refused(i) for i in range(10, 15)]
    found = detect_restarts(pts)
    assert kinds(found) == ["crash"] and found[0].ended_at is None


def ev(t_s: float, status: str = "ok", engine: str = "trt@candidate", **kw: Any) -> ExchangeEvent:
    return ExchangeEvent(engine, "candidate", T0 + timedelta(seconds=t_s), status, **kw)


def sent_every(seconds: float, until_s: float, engine: str = "trt@candidate") -> SentCounts:
    times = [T0 + timedelta(seconds=k * seconds) for k in range(int(until_s / seconds))]
    return SentCounts.from_times({engine: times})


def test_sent_counts_spans() -> None:
    sent = sent_every(1.0, 600)  # one a second
    lo = T0.timestamp()
    assert sent.total("trt@candidate") == 600
    assert sent.count("trt@candidate", lo + 30, lo + 90) == pytest.approx(60)
    assert sent.count("trt@candidate", lo + 10, lo + 20) == pytest.approx(10)
    assert sent.count("nobody", lo, lo + 10) == 0


def test_error_burst_far_above_baseline() -> None:
    sent = sent_every(1.0, 3600)
    background = [ev(t, "http_error", http_status=500) for t in range(150, 3600, 300)]  # 12
    burst = [ev(1800 + k, "http_error", http_status=503) for k in range(25)]
    data = DetectionInput(health=[], events=background + burst, sent=sent)
    found = detect_incidents(data)
    assert kinds(found) == ["error_burst"]
    f = found[0]
    assert f.started_at == T0 + timedelta(seconds=1800)
    assert f.evidence["failed"] == 25 and f.evidence["statuses"] == {"503": 25}
    assert f.evidence["p_value"] < 1e-6


def test_steady_error_share_is_not_a_burst() -> None:
    sent = sent_every(1.0, 3600)
    steady = [ev(t, "http_error", http_status=400) for t in range(0, 3600, 10)]  # 10 %
    assert detect_incidents(DetectionInput(health=[], events=steady, sent=sent)) == []


def test_timeouts_and_stalls_are_hangs() -> None:
    sent = sent_every(1.0, 3600)
    events = [ev(600 + k, "timeout", e2e_s=30.0) for k in range(3)]
    events += [ev(2000, "ok", ttft_s=0.05, e2e_s=40.0, max_itl_s=35.0)]
    events += [ev(2500, "ok", ttft_s=0.05, e2e_s=2.0, max_itl_s=0.5)]  # not a stall
    found = detect_incidents(DetectionInput(health=[], events=events, sent=sent))
    assert kinds(found) == ["hang", "hang"]
    assert found[0].evidence["timeouts"] == 3
    assert found[1].evidence["stalled"] == 1


def test_slow_health_is_a_hang() -> None:
    pts = series(40)
    pts[20] = hp(20, latency_s=8.0)
    pts[21] = hp(21, latency_s=9.5)
    found = detect_incidents(DetectionInput(health=pts))
    assert kinds(found) == ["hang"] and found[0].evidence["max_latency_s"] == 9.5


def test_connection_errors_during_a_crash_are_its_evidence() -> None:
    pts = series(100) + [refused(i) for i in range(100, 104)]
    pts += [hp(i, process_start_time=PST + 1600) for i in range(104, 200)]
    events = [ev(1500 + k, "connection_error", error="refused") for k in range(0, 60, 5)]
    events += [ev(1499, "http_error", http_status=502)]  # the dying process's last answer
    found = detect_incidents(
        DetectionInput(health=pts, events=events, sent=sent_every(1.0, 3000)),
        IncidentConfig(burst_min_errors=1),
    )
    assert kinds(found) == ["crash"]
    assert found[0].evidence["connection_errors"] == 12


def test_without_health_samples_connection_errors_make_a_crash() -> None:
    events = [ev(900 + k, "connection_error", error="refused") for k in range(0, 40, 4)]
    found = detect_incidents(DetectionInput(health=[], events=events, sent=sent_every(1.0, 3000)))
    assert kinds(found) == ["crash"] and found[0].evidence["connection_errors"] == 10


def test_answers_the_mirror_truncated_are_failures_not_a_crash() -> None:
    """A candidate whose answers outgrew the mirror's cap (status connection_error: the mirror
    closed the connection) is failing, not crashing: an error burst, never a crash, even when
    no health samples watch it."""
    error = f"{ANSWER_TRUNCATED} at 67108864 bytes (as kept; ...)"
    events = [ev(1800 + k, "connection_error", error=error) for k in range(25)]
    found = detect_incidents(DetectionInput(health=[], events=events, sent=sent_every(1.0, 3600)))
    assert kinds(found) == ["error_burst"] and found[0].evidence["failed"] == 25


def test_leak_of_known_rate_within_20_percent_and_warmup_after_crash() -> None:
    # 12 h at 30 s: GPU memory grows 120 MB/h from the start; a crash at 8 h resets it (the 4 h
    # after it are too short to be a leak of their own).
    pts = []
    for i in range(1440):
        t = i * 30.0
        restarted = t >= 8 * 3600
        base_t = t - 8 * 3600 if restarted else t
        pst = PST + 8 * 3600 if restarted else PST
        gpu = int(70_000 * MB + base_t / 3600 * 120 * MB)
        if 8 * 3600 - 60 <= t < 8 * 3600:
            pts.append(refused(i, step_s=30.0))
        else:
            pts.append(hp(i, step_s=30.0, process_start_time=pst, gpu_mem_bytes=gpu))
    found = detect_incidents(DetectionInput(health=pts))
    assert sorted(kinds(found)) == ["crash", "leak"]
    leak = next(f for f in found if f.kind == "leak")
    assert leak.evidence["mb_per_hour"] == pytest.approx(120.0, rel=0.2)
    assert leak.evidence["series"] == "gpu_mem_bytes"
    assert leak.ended_at is not None and leak.ended_at <= T0 + timedelta(hours=8)
    crash = next(f for f in found if f.kind == "crash")
    assert crash.ended_at is not None
    windows = warmup_windows(found, 60.0)
    assert len(windows) == 1
    assert windows[0].role == "candidate"
    assert windows[0].start == crash.ended_at
    assert windows[0].end == crash.ended_at + timedelta(seconds=60)


def test_trtllm_iteration_counter_going_back_is_a_restart() -> None:
    # TensorRT-LLM reports no process start time; a fast restart between scrapes shows only
    # as its iteration counter starting over.
    pts = [hp(i, process_start_time=None, iteration=100.0 * i) for i in range(20)]
    pts += [hp(i, process_start_time=None, iteration=5.0 * (i - 19)) for i in range(20, 40)]
    found = detect_restarts(pts)
    assert kinds(found) == ["crash"]
    assert found[0].evidence["signals"] == ["iteration counter went back"]
    idle = [hp(i, process_start_time=None, iteration=7.0) for i in range(20)]
    assert detect_restarts(idle) == []  # an idle engine's counter stands still


def test_one_failed_probe_is_not_an_outage() -> None:
    pts = [*series(10), hp(10, up=False, http_status=None, error="/health: TimeoutError")]
    pts += series(20)[11:]
    assert detect_restarts(pts) == []
    pts[11] = hp(11, up=False, http_status=None, error="/health: TimeoutError")
    assert kinds(detect_restarts(pts)) == ["hang"]


def test_config_for_a_time_accelerated_simulator() -> None:
    base = IncidentConfig()
    fast = base.for_time_scale(60)
    assert fast.leak_sustain_h == pytest.approx(base.leak_sustain_h / 60)
    assert fast.leak_max_span_h == pytest.approx(base.leak_max_span_h / 60)
    assert fast.leak_warmup_min == pytest.approx(base.leak_warmup_min / 60)
    assert fast.leak_threshold_mb_h == pytest.approx(base.leak_threshold_mb_h * 60)
    assert fast.hang_stall_s == base.hang_stall_s  # client-side latency is not scaled
    # 150 MB per simulated hour at 60x, scraped every real second for 8 real minutes.
    pts = [
        hp(i, step_s=1.0, gpu_mem_bytes=int(70_000 * MB + i / 3600 * 60 * 150 * MB))
        for i in range(480)
    ]
    found = detect_incidents(DetectionInput(health=pts), fast)
    assert kinds(found) == ["leak"]
    assert found[0].evidence["mb_per_hour"] / 60 == pytest.approx(150, rel=0.2)
    with pytest.raises(ValueError, match="positive"):
        base.for_time_scale(0)
