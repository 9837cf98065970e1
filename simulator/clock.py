"""Simulated time: real wall time, optionally accelerated, continuous across restarts.

The first serving process fixes the *epoch* (the wall-clock moment it starts serving, so slow
imports on a loaded machine do not eat into the fault schedule); the supervisor hands it to
every later process, so the fault timeline does not restart with the process.
With ``scale`` 60, one real second is one simulated minute.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime


class SimClock:
    def __init__(self, epoch: float, scale: float = 1.0, wall: Callable[[], float] = time.time):
        self.epoch = epoch
        self.scale = scale
        self._wall = wall

    def elapsed(self) -> float:
        """Simulated seconds since the epoch."""
        return (self._wall() - self.epoch) * self.scale

    def now(self) -> float:
        """Simulated Unix time (equals wall time when not accelerated)."""
        return self.epoch + self.elapsed()

    def at(self, elapsed: float) -> float:
        """Simulated Unix time of a point on the timeline."""
        return self.epoch + elapsed

    def real_seconds(self, sim_seconds: float) -> float:
        """How long ``sim_seconds`` of simulated time take in real time."""
        return sim_seconds / self.scale


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")
