"""Restarts from the health samples: crashes, version changes and health outages of one engine.

- **crash** (restart): a new ``process_start_time``; a TensorRT-LLM iteration counter going
  back; or, where the engine reports neither, ``/health`` down then up with the down samples
  refusing connections (a live server answering 503 is not a crash). The engine's first start
  (never seen up before) is not an incident.
- **version_change**: ``/version`` differs from the previous sample's. A restart that brings a
  new version is one version_change (``evidence.restart`` true), not also a crash.
- a health outage without a restart (503s or probe timeouts from a live process) is an
  **error_burst**, or a **hang** when most down samples timed out.

:func:`restart_times` and :func:`process_starts` say where memory resets (for leak detection),
:func:`warmup_windows` which time after each restart the latency analysis leaves out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from evaluator.incidents.model import Finding, HealthPoint, IncidentConfig, unix_s

if TYPE_CHECKING:
    from evaluator.latency import WarmupWindow


def _is_connection_failure(p: HealthPoint) -> bool:
    return p.http_status is None and not _is_timeout(p.error)


def _is_timeout(error: str | None) -> bool:
    return error is not None and "timeout" in error.lower().replace(" ", "")


def detect_restarts(
    points: Sequence[HealthPoint], config: IncidentConfig = IncidentConfig()
) -> list[Finding]:
    """Crashes, version changes and health outages without a restart, for ONE engine's health
    samples (any order)."""
    pts = sorted(points, key=lambda p: p.ts)
    out: list[Finding] = []
    prev_pst: float | None = None
    prev_iter: float | None = None
    prev_version: str | None = None
    last_up: HealthPoint | None = None
    down: list[HealthPoint] = []
    for p in pts:
        if not p.up:
            down.append(p)
            continue
        new_pst = (
            p.process_start_time is not None
            and prev_pst is not None
            and abs(p.process_start_time - prev_pst) > 1.0
        )
        iter_back = p.iteration is not None and prev_iter is not None and p.iteration < prev_iter
        restarted = new_pst or iter_back
        same_process = (
            p.process_start_time is not None
            and prev_pst is not None
            and abs(p.process_start_time - prev_pst) <= 1.0
        )
        refused = any(_is_connection_failure(d) for d in down)
        if last_up is not None and (restarted or (down and refused and not same_process)):
            changed = bool(p.version and prev_version and p.version != prev_version)
            start = down[0].ts if down else last_up.ts
            evidence: dict[str, Any] = {
                "source": "health",
                "last_up_at": last_up.ts.isoformat(),
                "first_down_at": down[0].ts.isoformat() if down else None,
                "back_up_at": p.ts.isoformat(),
                "down_samples": len(down),
                "down_errors": sorted({d.error or f"HTTP {d.http_status}" for d in down})[:5],
                "old_process_start_time": prev_pst,
                "new_process_start_time": p.process_start_time,
                "signals": [
                    name
                    for name, on in (
                        ("new process start time", new_pst),
                        ("iteration counter went back", iter_back),
                        ("health refused connections, then answered", bool(down) and refused),
                    )
                    if on
                ],
                "restart": True,
            }
            if changed:
                evidence.update(from_version=prev_version, to_version=p.version)
                out.append(Finding(p.engine, p.role, "version_change", start, p.ts, evidence))
            else:
                out.append(Finding(p.engine, p.role, "crash", start, p.ts, evidence))
        elif len(down) >= config.health_min_down_samples and last_up is not None:
            timeouts = sum(_is_timeout(d.error) for d in down)
            kind = "hang" if timeouts * 2 >= len(down) else "error_burst"
            out.append(
                Finding(
                    p.engine,
                    p.role,
                    kind,
                    down[0].ts,
                    p.ts,
                    {
                        "source": "health",
                        "down_samples": len(down),
                        "http_statuses": sorted({d.http_status or 0 for d in down}),
                        "down_errors": sorted({d.error or "" for d in down})[:5],
                        "same_process": same_process,
                    },
                )
            )
        elif p.version and prev_version and p.version != prev_version:
            out.append(
                Finding(
                    p.engine,
                    p.role,
                    "version_change",
                    p.ts,
                    p.ts,
                    {
                        "source": "health",
                        "from_version": prev_version,
                        "to_version": p.version,
                        "restart": False,
                    },
                )
            )
        if p.process_start_time is not None:
            prev_pst = p.process_start_time
        if p.iteration is not None:
            prev_iter = p.iteration
        if p.version:
            prev_version = p.version
        last_up = p
        down = []
    if down and last_up is not None and len(down) >= 2:
        refused = any(_is_connection_failure(d) for d in down)
        out.append(
            Finding(
                down[0].engine,
                down[0].role,
                "crash" if refused else "error_burst",
                down[0].ts,
                None,
                {
                    "source": "health",
                    "last_up_at": last_up.ts.isoformat(),
                    "first_down_at": down[0].ts.isoformat(),
                    "down_samples": len(down),
                    "still_down_at": down[-1].ts.isoformat(),
                    "down_errors": sorted({d.error or f"HTTP {d.http_status}" for d in down})[:5],
                },
            )
        )
    return out


def restart_times(findings: Iterable[Finding]) -> list[float]:
    """Unix seconds of every restart among ``findings`` (where memory resets): the new
    process's start time, kept within the restart's span (the engine's clock is not the
    sampler's), else the end of the restart."""
    out = []
    for f in findings:
        if f.evidence.get("restart") and f.ended_at is not None:
            end = unix_s(f.ended_at)
            pst = f.evidence.get("new_process_start_time")
            out.append(min(max(float(pst), unix_s(f.started_at)), end) if pst is not None else end)
    return sorted(out)


def process_starts(points: Sequence[HealthPoint], findings: Iterable[Finding]) -> list[float]:
    """Unix seconds of every process start of ONE engine: the first sample's process start
    time (when the engine reports one: the process the data begins with may have started
    just before) and every restart among ``findings`` (where memory resets and refills)."""
    first = next((p.process_start_time for p in points if p.process_start_time is not None), None)
    return sorted({*([] if first is None else [float(first)]), *restart_times(findings)})


def warmup_windows(findings: Iterable[Finding], warmup_s: float) -> list[WarmupWindow]:
    """The ``warmup_s`` after every restart (crash or restarting version change), per role,
    for :func:`evaluator.latency.analyze_latency` to leave out."""
    from evaluator.latency import WarmupWindow  # B1's class; imported when used

    out = []
    for f in findings:
        restarted = f.kind == "crash" or (f.kind == "version_change" and f.evidence.get("restart"))
        if restarted and f.ended_at is not None and warmup_s > 0:
            out.append(WarmupWindow(f.role, f.ended_at, f.ended_at + timedelta(seconds=warmup_s)))
    return out
