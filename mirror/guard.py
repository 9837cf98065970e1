"""The interference guard: backs the shadow rate off when the incumbent's latency degrades.

The candidate shares the incumbent's GPUs, so shadow traffic can slow down the answers the
client is waiting for. The guard watches the incumbent's rolling TTFT and E2E p95 and runs AIMD
on a rate multiplier in ``[min_rate, max_rate]``:

- **observe** (every finished incumbent exchange, cheap: a deque append): exchanges dispatched
  while a shadow request was in flight go into the *watched* rolling window (the last
  ``window_s`` seconds, at most ``max_samples``); those dispatched with none in flight (which
  includes every exchange in a shadow-off window) go into the *baseline* window
  (``baseline_window_s``), unless absolute baselines are configured. Comparing the two is
  comparing the incumbent with and without shadow work beside it: the interference itself.
- **evaluate** (at most every ``evaluate_interval_s``, from observe or admit): with at least
  ``min_samples`` in the rolling window and in the baseline, the incumbent is *degraded* when a
  p95 exceeds ``baseline * (1 + bound)``. Degraded: multiply the rate by ``decrease_factor``
  (at most once per ``backoff_cooldown_s``; the rolling window restarts, so the next decision
  uses fresh samples). Not degraded: add ``increase_step`` every ``recovery_interval_s``.
- **admit(u)**: a sampled request is shadowed when ``u < rate`` and no shadow-off window is
  open. Optional shadow-off windows (the last ``off_window_s`` of every ``off_window_every_s``)
  admit nothing, so the incumbent is measured alone -- the interference itself.

States (``state()["state"]`` and the ``shadow_ab_mirror_guard_state`` gauge): ``steady`` (rate
at the ceiling), ``backoff`` (just decreased), ``recovering`` (climbing back), ``off_window``.

Not thread-safe: the mirror calls it from its event loop only. The clock is injectable.

Errors: none at run time; :class:`GuardConfig` validation raises pydantic's ValidationError,
:class:`GuardTuning` and the guard ValueError for inconsistent values.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mirror.metrics import GUARD_P95, GUARD_RATE, GUARD_STATE

GuardState = Literal["steady", "backoff", "recovering", "off_window"]
STATES: tuple[GuardState, ...] = ("steady", "backoff", "recovering", "off_window")


WINDOW_S = 30.0
"""Rolling window of the watched p95: at the tens of requests a second a mirror sees, 30 s holds
hundreds of samples (a stable p95) and still reacts within a minute."""
MAX_SAMPLES = 2000
"""Most samples a window keeps: bounds the sort of a judgement (< 1 ms) at any traffic."""
MIN_SAMPLES = 30
"""Samples needed in the window and the baseline before judging: a p95 of fewer is one outlier."""
EVALUATE_INTERVAL_S = 1.0
"""How often to judge: once a second costs one sort per second, and no AIMD step is faster."""
DECREASE_FACTOR = 0.5
"""Multiplicative decrease: halve the shadow rate on degradation (AIMD's usual)."""
BACKOFF_COOLDOWN_S = 5.0
"""Least time between cuts: the window restarts after a cut, and needs a few seconds to refill."""
INCREASE_STEP = 0.05
"""Additive increase: 5 points of the multiplier per step (from the floor back in ~3 minutes)."""
RECOVERY_INTERVAL_S = 10.0
"""Time between increases: slower than cuts, so the guard settles below the degrading rate."""
MAX_RATE = 1.0
"""Ceiling of the multiplier: shadow.rate already caps how much is shadowed."""
BASELINE_WINDOW_S = 600.0
"""Window of the shadow-free baseline: ten minutes, so a short burst does not move it."""


@dataclass(frozen=True)
class GuardTuning:
    """The guard's tuning (not settings since issue 26: nobody needed another value); the
    defaults are the module's constants, tests pass tight values directly."""

    window_s: float = WINDOW_S
    max_samples: int = MAX_SAMPLES
    min_samples: int = MIN_SAMPLES
    evaluate_interval_s: float = EVALUATE_INTERVAL_S
    decrease_factor: float = DECREASE_FACTOR
    backoff_cooldown_s: float = BACKOFF_COOLDOWN_S
    increase_step: float = INCREASE_STEP
    recovery_interval_s: float = RECOVERY_INTERVAL_S
    max_rate: float = MAX_RATE
    baseline_window_s: float = BASELINE_WINDOW_S
    baseline_ttft_s: float | None = None
    """Absolute TTFT p95 baseline (None: measured in shadow-free exchanges)."""
    baseline_e2e_s: float | None = None
    """Absolute E2E p95 baseline (None: measured)."""

    def __post_init__(self) -> None:
        if self.min_samples > self.max_samples:
            raise ValueError(
                f"guard min_samples ({self.min_samples}) must be <= max_samples"
                f" ({self.max_samples})"
            )
        if not 0.0 < self.decrease_factor < 1.0:
            raise ValueError(f"guard decrease_factor ({self.decrease_factor}) must be in (0, 1)")


class GuardConfig(BaseModel):
    """Settings of the interference guard (``guard:`` in the mirror's YAML); its tuning is
    :class:`GuardTuning` (constants)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=True, description="off: every sampled request is shadowed")
    bound: float = Field(
        default=0.25, ge=0.0, le=100.0, description="allowed p95 degradation over the baseline"
    )
    min_rate: float = Field(default=0.05, ge=0.0, le=1.0, description="floor of the multiplier")
    off_window_every_s: float | None = Field(
        default=None, gt=0, description="open a shadow-off window every this many seconds"
    )
    off_window_s: float = Field(default=5.0, gt=0, description="length of a shadow-off window")

    @model_validator(mode="after")
    def _consistent(self) -> GuardConfig:
        if self.off_window_every_s is not None and self.off_window_s >= self.off_window_every_s:
            raise ValueError(
                f"guard off_window_s ({self.off_window_s}) must be shorter than"
                f" off_window_every_s ({self.off_window_every_s}), or shadowing never runs"
            )
        return self


class _Window:
    """Timestamped values of the last ``span_s`` seconds, at most ``cap`` of them."""

    __slots__ = ("_items", "span_s")

    def __init__(self, span_s: float, cap: int) -> None:
        self.span_s = span_s
        self._items: deque[tuple[float, float]] = deque(maxlen=cap)

    def add(self, now: float, value: float) -> None:
        self._items.append((now, value))

    def expire(self, now: float) -> None:
        items = self._items
        cutoff = now - self.span_s
        while items and items[0][0] < cutoff:
            items.popleft()

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)

    def p95(self) -> float | None:
        if not self._items:
            return None
        return percentile(sorted(v for _, v in self._items), 0.95)


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile of already sorted values, linear between closest ranks."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


class InterferenceGuard:
    """AIMD on the shadow rate multiplier, driven by the incumbent's rolling p95 latencies."""

    def __init__(
        self,
        config: GuardConfig,
        clock: Callable[[], float] = time.monotonic,
        tuning: GuardTuning | None = None,
    ) -> None:
        self.config = config
        self.tuning = tuning = tuning or GuardTuning()
        if config.min_rate > tuning.max_rate:
            raise ValueError(
                f"guard min_rate ({config.min_rate}) must be <= max_rate ({tuning.max_rate})"
            )
        self._clock = clock
        cap = tuning.max_samples
        self._ttft = _Window(tuning.window_s, cap)
        self._e2e = _Window(tuning.window_s, cap)
        self._base_ttft = _Window(tuning.baseline_window_s, cap)
        self._base_e2e = _Window(tuning.baseline_window_s, cap)
        self._rate = tuning.max_rate
        self._state: GuardState = "steady"
        self._started = clock()
        self._last_eval = -math.inf
        self._last_cut = -math.inf
        self._last_raise = self._started
        self._p95: dict[str, float | None] = {"ttft": None, "e2e": None}
        self._baseline: dict[str, float | None] = {
            "ttft": tuning.baseline_ttft_s,
            "e2e": tuning.baseline_e2e_s,
        }
        self._degraded = False
        self.cuts = 0
        self.raises = 0
        self._publish()

    # -- hot path -------------------------------------------------------------------------------

    def observe(self, ttft_s: float | None, e2e_s: float | None, shadow_active: bool) -> None:
        """Take one finished incumbent exchange's latencies (None when not measured)."""
        if not self.config.enabled:
            return
        now = self._clock()
        if shadow_active:
            if ttft_s is not None:
                self._ttft.add(now, ttft_s)
            if e2e_s is not None:
                self._e2e.add(now, e2e_s)
        else:
            if ttft_s is not None and self.tuning.baseline_ttft_s is None:
                self._base_ttft.add(now, ttft_s)
            if e2e_s is not None and self.tuning.baseline_e2e_s is None:
                self._base_e2e.add(now, e2e_s)
        if now - self._last_eval >= self.tuning.evaluate_interval_s:
            self._evaluate(now)

    def admit(self, u: float) -> bool:
        """May a sampled request be shadowed now? ``u`` is uniform in [0, 1)."""
        if not self.config.enabled:
            return u < self.tuning.max_rate
        now = self._clock()
        if self._in_off_window(now):
            if self._state != "off_window":
                self._evaluate(now)
            return False
        if self._state == "off_window" or now - self._last_eval >= self.tuning.evaluate_interval_s:
            self._evaluate(now)
        return u < self._rate

    # -- read-outs ------------------------------------------------------------------------------

    @property
    def rate(self) -> float:
        return self._rate

    def state(self) -> dict[str, Any]:
        """JSON-able summary for ``ExchangeRecord.guard`` (values as of the last evaluation)."""
        return {
            "state": self._state,
            "rate": round(self._rate, 6),
            "ttft_p95_s": self._p95["ttft"],
            "e2e_p95_s": self._p95["e2e"],
            "ttft_baseline_s": self._baseline["ttft"],
            "e2e_baseline_s": self._baseline["e2e"],
            "bound": self.config.bound,
            "degraded": self._degraded,
        }

    # -- judging --------------------------------------------------------------------------------

    def _in_off_window(self, now: float) -> bool:
        every = self.config.off_window_every_s
        if every is None:
            return False
        phase = (now - self._started) % every
        return phase >= every - self.config.off_window_s

    def _evaluate(self, now: float) -> None:
        cfg, tune = self.config, self.tuning
        self._last_eval = now
        for w in (self._ttft, self._e2e, self._base_ttft, self._base_e2e):
            w.expire(now)
        degraded = False
        for name, win, base_win, fixed in (
            ("ttft", self._ttft, self._base_ttft, tune.baseline_ttft_s),
            ("e2e", self._e2e, self._base_e2e, tune.baseline_e2e_s),
        ):
            p95 = win.p95() if len(win) >= tune.min_samples else None
            if fixed is not None:
                baseline: float | None = fixed
            elif len(base_win) >= tune.min_samples:
                baseline = base_win.p95()
            else:
                baseline = self._baseline[name]  # keep the last known until enough new samples
            self._p95[name] = p95
            self._baseline[name] = baseline
            if p95 is not None and baseline is not None and p95 > baseline * (1.0 + cfg.bound):
                degraded = True
        self._degraded = degraded

        if self._in_off_window(now):
            self._state = "off_window"
        elif degraded:
            if now - self._last_cut >= tune.backoff_cooldown_s and self._rate > cfg.min_rate:
                self._rate = max(cfg.min_rate, self._rate * tune.decrease_factor)
                self._last_cut = now
                self._last_raise = now
                self.cuts += 1
                # Judge the new rate on fresh samples only.
                self._ttft.clear()
                self._e2e.clear()
            self._state = "backoff" if self._rate < tune.max_rate else "steady"
        else:
            if self._rate < tune.max_rate and now - self._last_raise >= tune.recovery_interval_s:
                self._rate = min(tune.max_rate, round(self._rate + tune.increase_step, 9))
                self._last_raise = now
                self.raises += 1
            if self._rate >= tune.max_rate:
                self._state = "steady"
            elif self._last_raise > self._last_cut:
                self._state = "recovering"
            else:
                self._state = "backoff"
        self._publish()

    def _publish(self) -> None:
        GUARD_RATE.set(self._rate)
        for s in STATES:
            GUARD_STATE.labels(state=s).set(1.0 if s == self._state else 0.0)
        for name in ("ttft", "e2e"):
            value = self._p95[name]
            GUARD_P95.labels(metric=name).set(value if value is not None else math.nan)
