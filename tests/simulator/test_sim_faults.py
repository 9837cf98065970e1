"""Each fault, seen from outside (HTTP) and in its ledger entry.

Fault times are simulated seconds since the simulator started; the serving process needs up to
a second or two to come up, so schedules leave room for that.
"""

from __future__ import annotations

import itertools
import json
import socket
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from sim_helpers import FAST

from shadow_ab.dev.processes import RunningSim, SimulatorError, http_get, running_sim
from simulator.ledger import summarize
from simulator.scenario import ScenarioError

MODEL = "sim-llama-3-8b-instruct"
MESSAGES = [{"role": "user", "content": "Tell me a long story."}]


def with_faults(*faults: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {**FAST, **more, "faults": list(faults)}


def prom_value(sim: RunningSim, name: str) -> float | None:
    status, body = http_get(sim.base_url + "/metrics")
    if status != 200:
        return None
    for line in body.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def events(sim: RunningSim, event: str, kind: str | None = None) -> list[dict[str, Any]]:
    return [
        e for e in sim.ledger() if e["event"] == event and (kind is None or e.get("kind") == kind)
    ]


def test_crash_restarts_with_new_pid_and_start_time() -> None:
    faults = with_faults({"kind": "crash", "at_s": [4.0], "restart_delay_s": 1.5})
    with running_sim("vllm", "clean", overrides=faults) as sim:
        started = prom_value(sim, "process_start_time_seconds")
        assert started is not None
        sim.wait_down(timeout=20)
        assert http_get(sim.base_url + "/health")[0] == 0  # connection refused while down
        sim.wait_healthy(timeout=20)
        restarted = prom_value(sim, "process_start_time_seconds")
        assert restarted is not None and restarted > started
        time.sleep(0.3)  # a crash at a time already handled must not fire again
        assert sim.healthy()
        ledger = sim.ledger()
    kinds = [(e["event"], e.get("kind")) for e in ledger]
    assert kinds == [
        ("start", None),
        ("fault", "crash"),
        ("restart", None),
        ("start", None),
    ]
    start1, crash, restart, start2 = ledger
    assert crash["end"] - crash["start"] == pytest.approx(1.5)
    assert crash["params"] == {"restart_delay_s": 1.5}
    assert crash["fault_id"] == "crash#0.0"
    assert crash["pid"] == start1["pid"] == restart["crashed_pid"] != start2["pid"]
    assert start2["process_start_time"] == pytest.approx(restarted, abs=0.01)
    assert start2["restarts"] == 1
    assert restart["wall"] - crash["wall"] >= 1.5
    (incident,) = summarize(ledger).of_kind("crash")
    assert incident.recovered_at == start2["ts"] >= incident.end


def test_error_burst_fails_requests_and_is_counted() -> None:
    faults = with_faults(
        {
            "kind": "error_burst",
            "at_s": [0.0],
            "duration_s": 6.0,
            "status": 503,
            "health_fails": True,
        }
    )
    with running_sim("trtllm", "clean", overrides=faults, wait_for="listening") as sim:
        wait_for(lambda: events(sim, "fault", "error_burst"), 10, "the burst to start")
        status, body = http_get(sim.base_url + "/health")
        assert status == 503 and b"LLM is unavailable" in body
        c = openai.OpenAI(base_url=sim.v1, api_key="x", max_retries=0)
        failed = 0
        for _ in range(4):
            with pytest.raises(openai.InternalServerError) as exc:
                c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
            assert exc.value.status_code == 503
            assert exc.value.body["type"] == "InternalServerError"  # type: ignore[index]
            failed += 1
        end = wait_for(lambda: events(sim, "fault_end", "error_burst"), 15, "the burst to end")
        ok = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
        assert ok.choices[0].finish_reason == "length"
        assert sim.healthy()
        fault = events(sim, "fault", "error_burst")[0]
    assert fault["params"] == {"duration_s": 6.0, "status": 503, "share": 1.0, "health_fails": True}
    assert fault["end"] - fault["start"] == pytest.approx(6.0)
    assert end[0]["requests_failed"] == failed
    assert len(end[0]["requests_hit"]) == failed


def test_hang_stops_streams_mid_way_then_resumes() -> None:
    overrides = with_faults(
        {"kind": "hang", "at_s": [5.0], "duration_s": 2.0},
        latency={"decode_ms": 25, "prefill_base_ms": 1, "noise": 0.0},
        answers={"min_tokens": 240, "max_tokens": 240},
    )
    with running_sim("vllm", "clean", overrides=overrides) as sim:
        start = events(sim, "start")[0]
        assert start["elapsed_s"] < 3.5, "simulator came up too late for this schedule"
        c = openai.OpenAI(base_url=sim.v1, api_key="x", max_retries=0)
        stream = c.chat.completions.create(
            model=MODEL, messages=MESSAGES, temperature=0, stream=True, logprobs=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        arrivals, pieces, usage, rid = [], 0, None, None
        for chunk in stream:
            rid = chunk.id
            usage = chunk.usage or usage
            for ch in chunk.choices:
                if ch.logprobs and ch.logprobs.content:
                    arrivals.append(time.monotonic())
                    pieces += len(ch.logprobs.content)
        end = wait_for(lambda: events(sim, "fault_end", "hang"), 10, "the hang to end")
        hang = events(sim, "fault", "hang")[0]
    assert usage is not None and usage.completion_tokens == pieces == 240
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert max(gaps) >= 1.5  # the stream stopped for the hang (2 s), not just slowed
    assert rid in hang["inflight_requests"]
    assert hang["end"] - hang["start"] == pytest.approx(2.0)
    assert rid in end[0]["requests_hit"]


def test_leak_grows_at_the_set_rate_per_simulated_hour_vllm() -> None:
    overrides = with_faults({"kind": "leak", "start_s": 0, "mb_per_hour": 1000})
    with running_sim("vllm", "clean", overrides=overrides, time_scale=3600) as sim:
        samples = []
        for _ in range(3):
            status, body = http_get(sim.base_url + "/metrics")
            assert status == 200
            text = body.decode()
            values = {
                line.split(" ")[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith(("sim:", "process_resident"))
            }
            samples.append((values["sim:elapsed_seconds"], values["process_resident_memory_bytes"]))
            time.sleep(0.5)
        _status, version = http_get(sim.base_url + "/version")
        leak = events(sim, "fault", "leak")
    (t0, m0), (t2, m2) = samples[0], samples[-1]
    slope_mb_per_hour = (m2 - m0) / (1024 * 1024) / ((t2 - t0) / 3600.0)
    assert slope_mb_per_hour == pytest.approx(1000, rel=0.01)
    assert json.loads(version) == {"version": "0.32.0", "sim_time_scale": 3600.0}
    assert leak[0]["params"] == {"mb_per_hour": 1000.0, "target": "cpu"}
    assert leak[0]["time_scale"] == 3600.0


def test_leak_shows_in_trtllm_gpu_memory_and_marks_acceleration() -> None:
    overrides = with_faults({"kind": "leak", "start_s": 0, "mb_per_hour": 500})
    with running_sim("trtllm", "clean", overrides=overrides, time_scale=3600) as sim:
        c = openai.OpenAI(base_url=sim.v1, api_key="x", max_retries=0)
        mems = []
        for _ in range(2):
            raw = c.chat.completions.with_raw_response.create(
                model=MODEL, messages=MESSAGES, max_tokens=4
            )
            assert raw.headers["x-sim-time-scale"] == "3600.0"
            stats = json.loads(http_get(sim.base_url + "/metrics")[1])
            assert stats and all(s["simTimeScale"] == 3600.0 for s in stats)
            mems.append(stats[-1]["gpuMemUsage"])
            time.sleep(0.6)
        leak = events(sim, "fault", "leak")
    # 0.6 real s = 0.6 simulated hours at 500 MB/h: at least 250 MB more.
    assert mems[1] - mems[0] >= 250 * 1024 * 1024
    assert leak[0]["params"]["target"] == "gpu"


def test_drift_slows_decode_over_time() -> None:
    overrides = with_faults(
        {"kind": "drift", "start_s": 0, "growth_per_hour": 1.0},
        latency={"decode_ms": 1.0, "prefill_base_ms": 0, "noise": 0.0, "prefill_per_token_ms": 0},
    )
    with running_sim("trtllm", "clean", overrides=overrides, time_scale=3600) as sim:
        c = openai.OpenAI(base_url=sim.v1, api_key="x", max_retries=0)
        factors = []
        for _ in range(2):
            http_get(sim.base_url + "/metrics")  # drain
            c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
            stats = json.loads(http_get(sim.base_url + "/metrics")[1])
            factors.append(stats[-1]["iterLatencyMS"] / 1.0)  # decode-only, one sequence
            time.sleep(1.5)
        drift = events(sim, "fault", "drift")
    assert factors[0] >= 1.0
    assert factors[1] - factors[0] >= 1.4  # 1.5 simulated hours at +100%/hour
    assert drift[0]["params"] == {"growth_per_hour": 1.0}


def test_version_change_in_place() -> None:
    overrides = with_faults({"kind": "version_change", "at_s": [2.0], "to_version": "0.32.1"})
    with running_sim("vllm", "clean", overrides=overrides) as sim:
        wait_for(
            lambda: json.loads(http_get(sim.base_url + "/version")[1])["version"] == "0.32.1",
            10,
            "the new version",
        )
        change = events(sim, "fault", "version_change")
        assert len(events(sim, "start")) == 1
    assert change[0]["params"] == {
        "from_version": "0.32.0",
        "to_version": "0.32.1",
        "restart": False,
    }


def test_version_change_with_restart() -> None:
    overrides = with_faults(
        {
            "kind": "version_change",
            "at_s": [2.0],
            "to_version": "1.2.0",
            "restart": True,
            "restart_delay_s": 0.5,
        }
    )
    with running_sim("trtllm", "clean", overrides=overrides) as sim:
        wait_for(lambda: len(events(sim, "start")) == 2, 15, "the restart")
        sim.wait_healthy()
        assert json.loads(http_get(sim.base_url + "/version")[1]) == {"version": "1.2.0"}
        starts = events(sim, "start")
        assert [s["version"] for s in starts] == ["1.2.0rc2", "1.2.0"]
        assert starts[0]["pid"] != starts[1]["pid"]
        assert events(sim, "fault", "version_change")[0]["params"]["restart"] is True
        assert len(events(sim, "restart")) == 1


def test_multiprocess_vllm_has_no_process_metrics() -> None:
    with running_sim("vllm", "clean", overrides={**FAST, "multiprocess": True}) as sim:
        text = http_get(sim.base_url + "/metrics")[1].decode()
    assert "vllm:num_requests_running" in text
    assert "process_" not in text


def test_running_sim_reports_bad_scenarios_and_busy_ports() -> None:
    with (
        pytest.raises(ScenarioError, match="decod_ms"),
        running_sim("vllm", overrides={"latency": {"decod_ms": 1}}),
    ):
        pass
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SimulatorError, match="cannot listen"), running_sim("vllm", port=port):
            pass


def test_stop_is_clean_and_logged(tmp_path: Path) -> None:
    with running_sim("trtllm", overrides=FAST, ledger=tmp_path / "ledger.jsonl") as sim:
        pid = sim.ledger()[0]["pid"]
    assert sim.process.returncode == 0
    assert [(e["event"], e["pid"]) for e in sim.ledger()] == [("start", pid), ("stop", pid)]


def test_fault_runtime_timeline_without_a_server(tmp_path: Path) -> None:
    """The timeline with a fake clock: windows open and close, crashes call back once."""
    from simulator.clock import SimClock
    from simulator.faults import FaultRuntime
    from simulator.ledger import Ledger, read_ledger
    from simulator.scenario import load_scenario

    now = [1000.0]
    clock = SimClock(1000.0, 1.0, wall=lambda: now[0])
    sc = load_scenario(
        None,
        "trtllm",
        faults=[
            {"kind": "hang", "at_s": [10], "duration_s": 5},
            {"kind": "error_burst", "at_s": [20], "duration_s": 0.001},
            {"kind": "crash", "at_s": [30], "restart_delay_s": 7},
            {"kind": "version_change", "at_s": [25], "to_version": "2.0"},
            {"kind": "drift", "start_s": 0, "growth_per_hour": 3600},
            {"kind": "leak", "start_s": 5, "mb_per_hour": 3600},
        ],
    )
    path = tmp_path / "l.jsonl"
    crashes: list[tuple[float, float]] = []
    rt = FaultRuntime(
        sc,
        clock,
        Ledger(path, clock, flavor="trtllm", engine="e"),
        process_start=0.0,
        resume_after=None,
        on_crash=lambda at, delay, streak: crashes.append((at, delay)),
    )
    gpu0 = sc.memory.gpu_mb
    for t, hung in [(0, False), (11, True), (16, False), (22, False), (31, False)]:
        now[0] = 1000.0 + t
        rt.tick()
        assert rt.hang_active() is hung, t
    assert rt.version == "2.0"
    assert crashes == [(30.0, 7.0)]
    assert rt.decode_multiplier() == pytest.approx(1 + 31)  # +100% per simulated second here
    assert rt.memory_mb() == (sc.memory.cpu_mb, pytest.approx(gpu0 + 26))
    lines = [(e["event"], e.get("kind")) for e in read_ledger(path)]
    assert lines == [
        ("fault", "drift"),
        ("fault", "leak"),
        ("fault", "hang"),
        ("fault_end", "hang"),
        ("fault", "error_burst"),
        ("fault_end", "error_burst"),  # shorter than a tick: logged, closed, no effect
        ("fault", "version_change"),
        ("fault", "crash"),
    ]
    injected = summarize(read_ledger(path))
    assert [i.kind for i in injected.incidents] == [
        "drift", "leak", "hang", "error_burst", "version_change", "crash"
    ]  # fmt: skip
    (crash,) = injected.of_kind("crash")
    assert (crash.start, crash.end, crash.params) == (1030.0, 1037.0, {"restart_delay_s": 7.0})
    (hang,) = injected.of_kind("hang")
    assert (hang.start, hang.end, hang.effective) == (1010.0, 1015.0, True)
    # The process after the crash resumes the timeline: nothing fires twice.
    rt2 = FaultRuntime(
        sc,
        clock,
        Ledger(path, clock, flavor="trtllm", engine="e"),
        process_start=37.0,
        resume_after=30.0,
        on_crash=lambda at, delay, streak: crashes.append((at, delay)),
    )
    now[0] = 1000.0 + 40
    rt2.tick()
    assert crashes == [(30.0, 7.0)] and rt2.version == "2.0"
    assert rt2.memory_mb()[1] == pytest.approx(gpu0 + 3)  # the leak restarted with the process
    assert len(read_ledger(path)) == len(lines)


def test_crash_loop_backoff_doubles_and_resets(tmp_path: Path) -> None:
    from simulator.clock import SimClock
    from simulator.faults import FaultRuntime
    from simulator.ledger import Ledger
    from simulator.scenario import load_scenario

    now = [0.0]
    clock = SimClock(0.0, 1.0, wall=lambda: now[0])
    sc = load_scenario(
        None,
        "vllm",
        faults=[
            {"kind": "crash", "at_s": [10, 20, 40, 80, 130, 2000], "restart_delay_s": 5,
             "backoff": True, "backoff_max_s": 30},
        ],
    )  # fmt: skip
    seen: list[tuple[float, float, int]] = []
    resume, streak, start = None, 0, 0.0
    for t in (10, 20, 40, 80, 130, 2000):
        rt = FaultRuntime(
            sc,
            clock,
            Ledger(None, clock, flavor="vllm", engine="e"),
            process_start=start,
            resume_after=resume,
            crash_streak=streak,
            on_crash=lambda at, delay, k: seen.append((at, delay, k)),
        )
        now[0] = float(t)
        rt.tick()
        at, delay, streak = seen[-1]
        resume, start = at, at + delay
    assert [(d, k) for _, d, k in seen] == [
        (5, 1), (10, 2), (20, 3), (30, 4), (30, 5),  # doubling, capped at 30
        (5, 1),  # ran for over 10 minutes before this crash: the backoff starts again
    ]  # fmt: skip
