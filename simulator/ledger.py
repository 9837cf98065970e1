"""The ledger: a JSON-lines file of everything the simulator injected.

Appended by whoever injects (the serving process for faults and divergences, the supervisor for
restarts), one ``write`` per line on an ``O_APPEND`` file, so lines survive a crash and never
interleave. Every line carries::

    event        "start" | "fault" | "fault_end" | "restart" | "divergence" | "stop"
    ts, ts_iso   simulated time (Unix seconds / ISO 8601)
    elapsed_s    simulated seconds since the simulator's epoch
    wall         real Unix time of the write
    time_scale   simulated seconds per real second (1 = real time)
    flavor, engine, pid

Fault lines add ``kind``, ``fault_id`` (stable across restarts), ``start``/``end`` (simulated
Unix seconds; ``end`` null when open-ended) and ``params``. Divergence lines add
``request_id``, ``pair_id`` (the ``x-shadow-pair-id`` request header, if sent), ``choice``,
``position``, ``near_tie``, ``reference_token``, ``token``, ``visible``, ``knob`` (``divergence``
or ``kernels``: a flip that rejoins the reference) and the prompt's hash. Truncation lines
(``quality.truncate``) add ``request_id``, ``pair_id``, ``choice``, ``kept`` and ``of`` (tokens
kept of the answer's length) and ``finish``.

:func:`summarize` groups a ledger's lines into incidents, divergences and restarts for tests
that check an evaluator found exactly what was injected.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from simulator.clock import SimClock, iso


class Ledger:
    def __init__(self, path: Path | None, clock: SimClock, *, flavor: str, engine: str) -> None:
        self.path = path
        self._clock = clock
        self._fd: int | None = None
        self._base = {"flavor": flavor, "engine": engine}
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, event: str, **fields: Any) -> dict[str, Any]:
        elapsed = self._clock.elapsed()
        ts = self._clock.at(elapsed)
        line: dict[str, Any] = {
            "event": event,
            "ts": round(ts, 6),
            "ts_iso": iso(ts),
            "elapsed_s": round(elapsed, 6),
            "wall": round(self._clock._wall(), 6),
            "time_scale": self._clock.scale,
            **self._base,
            "pid": os.getpid(),
            **fields,
        }
        if self._fd is not None:
            os.write(self._fd, orjson.dumps(line) + b"\n")
        return line

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_ledger(path: Path | str) -> list[dict[str, Any]]:
    """Every line of a ledger file, in order (a missing file is an empty ledger)."""
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for n, raw in enumerate(p.read_bytes().splitlines(), 1):
        if not raw.strip():
            continue
        try:
            out.append(orjson.loads(raw))
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"{p}:{n}: not a JSON line ({exc}); the ledger is corrupt") from exc
    return out


@dataclass(frozen=True)
class Incident:
    """One injected fault occurrence, in simulated Unix seconds."""

    kind: str
    fault_id: str
    start: float
    end: float | None
    params: dict[str, Any]
    effective: bool = True
    """False for a window that fell entirely while the engine was down."""
    recovered_at: float | None = None
    """Crashes and restarting version changes: when the next serving process started (the
    planned ``end`` plus the process's own start-up time); None if it never did."""


@dataclass
class Injected:
    """Everything one ledger says was injected, ready for an evaluator's test to compare."""

    incidents: list[Incident] = field(default_factory=list)
    divergences: list[dict[str, Any]] = field(default_factory=list)
    restarts: list[dict[str, Any]] = field(default_factory=list)
    starts: list[dict[str, Any]] = field(default_factory=list)
    truncations: list[dict[str, Any]] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[Incident]:
        return [i for i in self.incidents if i.kind == kind]

    def diverged_pairs(self, visible_only: bool = True) -> dict[str, dict[str, Any]]:
        """Divergence lines by ``pair_id`` (requests sent with ``x-shadow-pair-id``)."""
        return {
            d["pair_id"]: d
            for d in self.divergences
            if d.get("pair_id") and (d.get("visible", True) or not visible_only)
        }


def summarize(lines: list[dict[str, Any]]) -> Injected:
    """Group ledger lines (from :func:`read_ledger`) by what was injected."""
    out = Injected()
    for line in lines:
        event = line.get("event")
        if event == "fault":
            out.incidents.append(
                Incident(
                    kind=line["kind"],
                    fault_id=line["fault_id"],
                    start=line["start"],
                    end=line.get("end"),
                    params=dict(line.get("params") or {}),
                    effective=not line.get("while_down", False),
                )
            )
        elif event == "divergence":
            out.divergences.append(line)
        elif event == "restart":
            out.restarts.append(line)
        elif event == "start":
            out.starts.append(line)
        elif event == "truncation":
            out.truncations.append(line)
    for i, incident in enumerate(out.incidents):
        restarting = incident.kind == "crash" or incident.params.get("restart") is True
        if restarting:
            later = [s["ts"] for s in out.starts if s["ts"] > incident.start]
            out.incidents[i] = replace(incident, recovered_at=min(later) if later else None)
    return out
