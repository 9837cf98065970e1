"""Generated months of one engine's memory series, shaped as month-long production data is.

Used by tests/evaluator/test_leak_months.py (the property test) and bench/leak_validity.py.
Pure numpy, seeded; no store. A month is what leak detection reads from the store: one point
per ``bin_s`` (the loader's 2-minute bin means, at the bin's middle), in bytes, plus the times
the engine's process started (the deployment's first start and every restart).

What a generated month assumes (so a reader can question it):

- **Level**: a constant base (70 000 MiB) plus noise; nothing grows unless a leak is injected.
- **Noise** (``noise``): ``"white"``, independent per bin, sd ``noise_sd_mb``; ``"ar1"``, a
  stationary AR(1) process with marginal sd ``noise_sd_mb`` whose correlation decays as
  exp(-lag / ``noise_decay_min``) (15 min: a bin is correlated 0.875 with the next): memory
  that allocator pools and caches fill and drain over minutes.
- **Daily cycle** (``daily_mb``): a sinusoid of that amplitude with a period of one day and a
  random phase (load follows the clock). Its steepest slope is ``daily_mb * 2 pi / 24`` MB/h:
  a cycle steeper than the leak threshold *is* growth above it for hours, which no detector
  that looks at one engine can tell from a leak (comparing the two engines' slopes can).
- **Restarts**: a Poisson process of ``restarts_per_day`` isolated restarts; a share
  ``pair_share`` of them is followed by a second restart 2.5-4 h later (two restarts hours
  apart); a share ``fast_share`` are faster than a scrape (no gap in the data), the others
  leave a 1-3 minute gap (down samples carry no memory). The deployment's first start is at
  the month's start.
- **Refill after each start**: memory drops by ``drop_mb`` (log-uniform in the range: 300 MiB
  to 6 GiB; (0, 0): no refill) and refills over ``refill_h`` hours (uniform in the range): half
  the time as a straight ramp then flat ("hundreds of MB/h for an hour, then flat"), half as a
  saturating exponential (time constant a third of the refill time).
- **Leak** (``leak``): (start hour, hours, MB/h): linear growth for that long, then flat at
  the level reached, until the next restart resets memory. Placed by :func:`leak_month` in a
  stretch without restarts, at least two hours after the last start.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from scipy import signal

MB = float(2**20)
DAY_S = 86400.0
LOOK_DAYS: tuple[int, ...] = (3, 5, 7, 10, 14, 21, 30)
"""The days a reviewer looks at the month (windows from the month's start to that day)."""


@dataclass(frozen=True)
class MonthSpec:
    days: float = 30.0
    bin_s: float = 120.0
    base_mb: float = 70_000.0
    noise: str = "ar1"
    noise_sd_mb: float = 50.0
    noise_decay_min: float = 15.0
    daily_mb: float = 0.0
    restarts_per_day: float = 0.4
    pair_share: float = 0.3
    fast_share: float = 0.5
    drop_mb: tuple[float, float] = (300.0, 6144.0)
    refill_h: tuple[float, float] = (0.5, 1.5)
    leak: tuple[float, float, float] | None = None
    """(start hour, hours, MB per hour)."""


@dataclass(frozen=True)
class Month:
    t: np.ndarray
    """Unix seconds of each point."""
    y: np.ndarray
    """Memory in bytes."""
    starts: list[float]
    """The first start (the month's start) and every restart, Unix seconds."""
    spec: MonthSpec

    @property
    def restarts(self) -> list[float]:
        return self.starts[1:]

    def until(self, day: float) -> Month:
        """The month as seen at a look ``day`` days after its start."""
        end = float(self.t[0]) + day * DAY_S
        keep = self.t < end
        return Month(self.t[keep], self.y[keep], [s for s in self.starts if s < end], self.spec)


QUIET = {"restarts_per_day": 0.0, "drop_mb": (0.0, 0.0)}
"""MonthSpec fields for a month of noise alone: no restart, no refill."""

T0 = 1_790_000_000.0
"""Where generated months start (2026-09-21 14:13 UTC; not aligned to anything)."""


def restart_times(spec: MonthSpec, rng: np.random.Generator) -> list[tuple[float, bool]]:
    """(seconds after the month's start, fast) of every restart, sorted."""
    span = spec.days * DAY_S
    out: list[tuple[float, bool]] = []
    n = rng.poisson(spec.restarts_per_day * spec.days)
    for at in rng.uniform(0.0, span, n):
        out.append((float(at), bool(rng.random() < spec.fast_share)))
        if rng.random() < spec.pair_share:
            second = at + rng.uniform(2.5, 4.0) * 3600.0
            if second < span:
                out.append((float(second), bool(rng.random() < spec.fast_share)))
    return sorted(out)


def noise(spec: MonthSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` noise values in MiB, one per bin."""
    sd = spec.noise_sd_mb
    if spec.noise == "white":
        return rng.normal(0.0, sd, n)
    if spec.noise != "ar1":
        raise ValueError(f"unknown noise {spec.noise!r}")
    phi = math.exp(-spec.bin_s / (spec.noise_decay_min * 60.0))
    shocks = rng.normal(0.0, sd * math.sqrt(1.0 - phi * phi), n)
    shocks[0] = rng.normal(0.0, sd)  # the process starts in its stationary state
    return np.asarray(signal.lfilter([1.0], [1.0, -phi], shocks))


def generate(spec: MonthSpec, seed: int) -> Month:
    """One month of memory (see the module docstring)."""
    rng = np.random.default_rng(seed)
    restarts = restart_times(spec, rng)
    rel = np.arange(0.0, spec.days * DAY_S, spec.bin_s) + spec.bin_s / 2.0
    keep = np.ones(len(rel), dtype=bool)
    level = np.full(len(rel), spec.base_mb)
    starts = [0.0] + [at for at, _ in restarts]
    for k, start in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else math.inf
        lo, hi = np.searchsorted(rel, start), np.searchsorted(rel, end)
        since = (rel[lo:hi] - start) / 3600.0
        lo_mb, hi_mb = spec.drop_mb
        drop = math.exp(rng.uniform(math.log(lo_mb), math.log(hi_mb))) if lo_mb > 0 else 0.0
        refill = rng.uniform(*spec.refill_h)
        if rng.random() < 0.5:
            missing = drop * np.clip(1.0 - since / refill, 0.0, 1.0)
        else:
            missing = drop * np.exp(-since / (refill / 3.0))
        level[lo:hi] -= missing
        if k > 0 and not restarts[k - 1][1]:  # a crash: down for 1-3 minutes, no memory
            keep[lo : np.searchsorted(rel, start + rng.uniform(60.0, 180.0))] = False
    if spec.leak is not None:
        leak_h, hours, rate = spec.leak
        a = leak_h * 3600.0
        nxt = next((s for s in starts if s > a), math.inf)
        grown = np.clip((rel - a) / 3600.0, 0.0, hours) * rate
        level += np.where(rel < nxt, grown, 0.0)
    if spec.daily_mb:
        phase = rng.uniform(0.0, 2.0 * math.pi)
        level += spec.daily_mb * np.sin(2.0 * math.pi * rel / DAY_S + phase)
    level += noise(spec, len(rel), rng)
    return Month(T0 + rel[keep], level[keep] * MB, [T0 + s for s in starts], spec)


def leak_month(
    spec: MonthSpec,
    seed: int,
    *,
    hours: float = 6.0,
    mb_per_hour: float = 50.0,
    by_day: float = 2.5,
) -> Month:
    """A month with one linear leak of ``mb_per_hour`` for ``hours``, ending by ``by_day`` (so
    every look from day 3 on holds all of it), in a stretch without restarts that starts at
    least two hours after the last start."""
    rng = np.random.default_rng([seed, 1])
    restarts = [at for at, _ in restart_times(spec, np.random.default_rng(seed))]
    starts = [0.0, *restarts]
    latest = by_day * 24.0 - hours
    for _ in range(1000):
        at = rng.uniform(2.0, latest)
        before = max(s for s in starts if s <= at * 3600.0)
        clear = all(not (at * 3600.0 <= s <= (at + hours + 1.0) * 3600.0) for s in starts)
        if clear and at * 3600.0 - before >= 2 * 3600.0:
            return generate(replace(spec, leak=(at, hours, mb_per_hour)), seed)
    raise ValueError(f"seed {seed}: no room for a {hours} h leak before day {by_day}")


@dataclass(frozen=True)
class Look:
    """What one detector said about one month at one look."""

    day: int
    leaks: list[tuple[float, float, float]]
    """(start, end, MB/hour) of every leak found."""

    def on_leak(self, month: Month) -> list[tuple[float, float, float]]:
        """The leaks overlapping the month's injected leak."""
        if month.spec.leak is None:
            return []
        a = month.starts[0] + month.spec.leak[0] * 3600.0  # the month starts with its process
        b = a + month.spec.leak[1] * 3600.0
        return [lk for lk in self.leaks if lk[0] < b and lk[1] > a]

    def false(self, month: Month) -> list[tuple[float, float, float]]:
        """The leaks that are not the injected one."""
        hit = self.on_leak(month)
        return [lk for lk in self.leaks if lk not in hit]


Detector = Callable[[Month], list[tuple[float, float, float]]]


def looks(month: Month, detect: Detector, days: tuple[int, ...] = LOOK_DAYS) -> list[Look]:
    """``detect`` run on the month as seen at each of ``days``."""
    return [Look(day, detect(month.until(day))) for day in days]
