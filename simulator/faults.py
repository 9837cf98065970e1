"""The fault timeline as one serving process lives it.

:class:`FaultRuntime` walks every scheduled fault's occurrences (deterministic per scenario
seed, continuous across restarts because simulated time is), writes each to the ledger when it
happens, and answers the questions the server asks on its hot path: is the engine hung, should
this request fail, how much slower is decoding, how much memory is reported, which version.

Occurrences that fell while the process was down (between the crash it resumes after and its
own start) are handled at start: crashes are skipped (nothing was running), windows are logged
with ``while_down`` true, version changes take effect.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from simulator.clock import SimClock
from simulator.ledger import Ledger
from simulator.scenario import (
    BACKOFF_RESET_S,
    CrashFault,
    DriftFault,
    ErrorBurstFault,
    HangFault,
    LeakFault,
    Scenario,
    VersionChangeFault,
)

CrashHandler = Callable[[float, float, int], None]
"""Called with (simulated elapsed time of the crash, restart delay in simulated seconds,
consecutive crashes so far counting this one)."""


@dataclass
class _Track:
    index: int
    spec: CrashFault | HangFault | ErrorBurstFault | VersionChangeFault
    times: Iterator[float]
    next_t: float | None
    count: int = 0

    def advance(self) -> None:
        self.next_t = next(self.times, None)
        self.count += 1


@dataclass
class Window:
    fault_id: str
    kind: str
    start: float
    end: float
    spec: HangFault | ErrorBurstFault
    failed: int = 0
    hit_requests: list[str] = field(default_factory=list)


class FaultRuntime:
    def __init__(
        self,
        scenario: Scenario,
        clock: SimClock,
        ledger: Ledger,
        *,
        process_start: float,
        resume_after: float | None,
        on_crash: CrashHandler,
        inflight: Callable[[], list[str]] = list,
        rng: random.Random | None = None,
        crash_streak: int = 0,
    ) -> None:
        """``process_start``/``resume_after`` are simulated elapsed seconds: this process's
        start, and the crash it follows (None for the first process)."""
        self.scenario = scenario
        self.clock = clock
        self.ledger = ledger
        self.process_start = process_start
        self.resume_after = resume_after
        self._on_crash = on_crash
        self.crash_streak = crash_streak
        """Consecutive crashes before this process (for the backoff)."""
        self._inflight = inflight
        self._rng = rng or random.Random(scenario.seed)
        self.windows: list[Window] = []
        self.version = scenario.reported_version
        self._tracks: list[_Track] = []
        self._leaks: list[LeakFault] = []
        self._drifts: list[DriftFault] = []
        self._continuous_logged: set[int] = set()
        for i, spec in enumerate(scenario.faults):
            if isinstance(spec, LeakFault):
                self._leaks.append(spec)
            elif isinstance(spec, DriftFault):
                self._drifts.append(spec)
            else:
                times = spec.occurrences(scenario.seed * 1_000_003 + i)
                track = _Track(i, spec, times, None, -1)
                track.advance()
                # Versions already reached are in effect; occurrences handled by an earlier
                # process (before the crash this one resumes after) are not repeated.
                while (
                    resume_after is not None
                    and track.next_t is not None
                    and track.next_t <= resume_after
                ):
                    if isinstance(spec, VersionChangeFault):
                        self.version = spec.to_version
                    track.advance()
                self._tracks.append(track)

    # -- the timeline -------------------------------------------------------------------

    def tick(self) -> None:
        """Fire everything due by now; called every few real milliseconds."""
        now = self.clock.elapsed()
        for w in [w for w in self.windows if w.end <= now]:
            self.windows.remove(w)
            self._close(w)
        for i, spec in enumerate(self.scenario.faults):
            due = isinstance(spec, LeakFault | DriftFault) and spec.start_s <= now
            if due and i not in self._continuous_logged:
                assert isinstance(spec, LeakFault | DriftFault)
                self._continuous_logged.add(i)
                # A restarted process does not repeat what an earlier one already logged.
                if self.resume_after is None or spec.start_s > self.resume_after:
                    self._log_continuous(i, spec)
        while True:  # due occurrences of all faults, in time order
            ready = [k for k in self._tracks if k.next_t is not None and k.next_t <= now]
            if not ready:
                break
            track = min(ready, key=lambda k: (k.next_t or 0.0, k.index))
            t = track.next_t
            assert t is not None
            fault_id = f"{track.spec.kind}#{track.index}.{track.count}"
            track.advance()
            self._fire(track.spec, fault_id, t, now)

    def _close(self, w: Window) -> None:
        self.ledger.write(
            "fault_end",
            kind=w.kind,
            fault_id=w.fault_id,
            start=self.clock.at(w.start),
            end=self.clock.at(w.end),
            requests_failed=w.failed,
            requests_hit=w.hit_requests,
        )

    def _log_continuous(self, index: int, spec: LeakFault | DriftFault) -> None:
        params = spec.model_dump(exclude={"kind", "start_s"})
        if isinstance(spec, LeakFault):
            params["target"] = self.leak_target(spec)
        self.ledger.write(
            "fault",
            kind=spec.kind,
            fault_id=f"{spec.kind}#{index}",
            start=self.clock.at(spec.start_s),
            end=None,
            params=params,
        )

    def _fire(self, spec: Any, fault_id: str, t: float, now: float) -> None:
        while_down = t < self.process_start
        if isinstance(spec, CrashFault):
            if while_down:
                return  # nothing was running to crash
            delay, streak = spec.restart_delay_s, 1
            params: dict[str, Any] = {"restart_delay_s": delay}
            if spec.backoff:
                quick = t - self.process_start < BACKOFF_RESET_S
                streak = self.crash_streak + 1 if quick else 1
                delay = min(spec.backoff_max_s, spec.restart_delay_s * 2 ** (streak - 1))
                params = {"restart_delay_s": delay, "crash_streak": streak}
            self.ledger.write(
                "fault",
                kind="crash",
                fault_id=fault_id,
                start=self.clock.at(t),
                end=self.clock.at(t + delay),
                params=params,
                inflight_requests=self._inflight(),
            )
            self._on_crash(t, delay, streak)
        elif isinstance(spec, VersionChangeFault):
            old, self.version = self.version, spec.to_version
            restart = spec.restart and not while_down
            self.ledger.write(
                "fault",
                kind="version_change",
                fault_id=fault_id,
                start=self.clock.at(t),
                end=None,
                params={"from_version": old, "to_version": spec.to_version, "restart": restart},
            )
            if restart:
                self._on_crash(t, spec.restart_delay_s, 0)  # a deliberate restart: no backoff
        else:
            end = t + spec.duration_s
            params = spec.model_dump(include={"duration_s", "status", "share", "health_fails"})
            line = self.ledger.write(
                "fault",
                kind=spec.kind,
                fault_id=fault_id,
                start=self.clock.at(t),
                end=self.clock.at(end),
                params=params,
                while_down=while_down and end <= self.process_start,
                inflight_requests=self._inflight() if spec.kind == "hang" else [],
            )
            window = Window(fault_id, spec.kind, t, end, spec)
            window.hit_requests = list(line["inflight_requests"])
            if end > now:
                self.windows.append(window)
            else:  # over before a tick saw it (while down, or shorter than a tick): no effect
                self._close(window)

    # -- questions from the hot path ------------------------------------------------------

    def health_failing(self) -> bool:
        return any(
            isinstance(w.spec, ErrorBurstFault) and w.spec.health_fails for w in self.windows
        )

    def hang_active(self) -> bool:
        return any(w.kind == "hang" for w in self.windows)

    def note_hung_request(self, request_id: str) -> None:
        for w in self.windows:
            if w.kind == "hang" and len(w.hit_requests) < 10_000:
                w.hit_requests.append(request_id)

    def error_for_request(self, request_id: str) -> int | None:
        """The HTTP status to fail this request with, or None to serve it."""
        for w in self.windows:
            if isinstance(w.spec, ErrorBurstFault) and self._rng.random() < w.spec.share:
                w.failed += 1
                if len(w.hit_requests) < 10_000:
                    w.hit_requests.append(request_id)
                return w.spec.status
        return None

    def decode_multiplier(self) -> float:
        now = self.clock.elapsed()
        mult = 1.0
        for d in self._drifts:
            mult *= d.multiplier(now)
        return mult

    def leak_target(self, spec: LeakFault) -> str:
        if spec.target != "auto":
            return spec.target
        return "cpu" if self.scenario.flavor == "vllm" else "gpu"

    def memory_mb(self) -> tuple[float, float]:
        """Reported (cpu, gpu) memory: the base plus every leak since this process started."""
        now = self.clock.elapsed()
        cpu, gpu = self.scenario.memory.cpu_mb, self.scenario.memory.gpu_mb
        for leak in self._leaks:
            since = max(leak.start_s, self.process_start)
            grown = leak.mb_per_hour * max(0.0, now - since) / 3600.0
            if self.leak_target(leak) == "cpu":
                cpu += grown
            else:
                gpu += grown
        return cpu, gpu
