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

Errors: none at run time; :class:`GuardConfig` validation raises pydantic's ValidationError.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mirror.metrics import GUARD_P95, GUARD_RATE, GUARD_STATE

GuardState = Literal["steady", "backoff", "recovering", "off_window"]
STATES: tuple[GuardState, ...] = ("steady", "backoff", "recovering", "off_window")


class GuardConfig(BaseModel):
    """Settings of the interference guard (``guard:`` in the mirror's YAML)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=True, description="off: admit() follows max_rate only")
    bound: float = Field(
        default=0.25, ge=0.0, le=100.0, description="allowed p95 degradation over the baseline"
    )
    window_s: float = Field(default=30.0, gt=0, description="rolling window of the p95 watched")
    max_samples: int = Field(default=2000, ge=10, description="most samples a window keeps")
    min_samples: int = Field(default=30, ge=1, description="samples needed before judging")
    evaluate_interval_s: float = Field(
        default=1.0, ge=0, description="how often to judge (0: on every observation)"
    )
    decrease_factor: float = Field(
        default=0.5, gt=0.0, lt=1.0, description="multiplicative decrease"
    )
    backoff_cooldown_s: float = Field(default=5.0, ge=0, description="least time between cuts")
    increase_step: float = Field(default=0.05, gt=0.0, le=1.0, description="additive increase")
    recovery_interval_s: float = Field(default=10.0, gt=0, description="time between increases")
    min_rate: float = Field(default=0.05, ge=0.0, le=1.0, description="floor of the multiplier")
    max_rate: float = Field(default=1.0, gt=0.0, le=1.0, description="ceiling of the multiplier")
    baseline_window_s: float = Field(
        default=600.0, gt=0, description="window of the shadow-free baseline"
    )
    baseline_ttft_s: float | None = Field(
        default=None, gt=0, description="absolute TTFT p95 baseline (else measured)"
    )
    baseline_e2e_s: float | None = Field(
        default=None, gt=0, description="absolute E2E p95 baseline (else measured)"
    )
    off_window_every_s: float | None = Field(
        default=None, gt=0, description="open a shadow-off window every this many seconds"
    )
    off_window_s: float = Field(default=5.0, gt=0, description="length of a shadow-off window")

    @model_validator(mode="after")
    def _consistent(self) -> GuardConfig:
        if self.min_rate > self.max_rate:
            raise ValueError(
                f"guard min_rate ({self.min_rate}) must be <= max_rate ({self.max_rate})"
            )
        if self.off_window_every_s is not None and self.off_window_s >= self.off_window_every_s:
            raise ValueError(
                f"guard off_window_s ({self.off_window_s}) must be shorter than"
                f" off_window_every_s ({self.off_window_every_s}), or shadowing never runs"
            )
        if self.min_samples > self.max_samples:
            raise ValueError(
                f"guard min_samples ({self.min_samples}) must be <= max_samples"
                f" ({self.max_samples})"
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

    def __init__(self, config: GuardConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        cap = config.max_samples
        self._ttft = _Window(config.window_s, cap)
        self._e2e = _Window(config.window_s, cap)
        self._base_ttft = _Window(config.baseline_window_s, cap)
        self._base_e2e = _Window(config.baseline_window_s, cap)
        self._rate = config.max_rate
        self._state: GuardState = "steady"
        self._started = clock()
        self._last_eval = -math.inf
        self._last_cut = -math.inf
        self._last_raise = self._started
        self._p95: dict[str, float | None] = {"ttft": None, "e2e": None}
        self._baseline: dict[str, float | None] = {
            "ttft": config.baseline_ttft_s,
            "e2e": config.baseline_e2e_s,
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
            if ttft_s is not None and self.config.baseline_ttft_s is None:
                self._base_ttft.add(now, ttft_s)
            if e2e_s is not None and self.config.baseline_e2e_s is None:
                self._base_e2e.add(now, e2e_s)
        if now - self._last_eval >= self.config.evaluate_interval_s:
            self._evaluate(now)

    def admit(self, u: float) -> bool:
        """May a sampled request be shadowed now? ``u`` is uniform in [0, 1)."""
        if not self.config.enabled:
            return u < self.config.max_rate
        now = self._clock()
        if self._in_off_window(now):
            if self._state != "off_window":
                self._evaluate(now)
            return False
        if self._state == "off_window" or now - self._last_eval >= self.config.evaluate_interval_s:
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
        cfg = self.config
        self._last_eval = now
        for w in (self._ttft, self._e2e, self._base_ttft, self._base_e2e):
            w.expire(now)
        degraded = False
        for name, win, base_win, fixed in (
            ("ttft", self._ttft, self._base_ttft, cfg.baseline_ttft_s),
            ("e2e", self._e2e, self._base_e2e, cfg.baseline_e2e_s),
        ):
            p95 = win.p95() if len(win) >= cfg.min_samples else None
            if fixed is not None:
                baseline: float | None = fixed
            elif len(base_win) >= cfg.min_samples:
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
            if now - self._last_cut >= cfg.backoff_cooldown_s and self._rate > cfg.min_rate:
                self._rate = max(cfg.min_rate, self._rate * cfg.decrease_factor)
                self._last_cut = now
                self._last_raise = now
                self.cuts += 1
                # Judge the new rate on fresh samples only.
                self._ttft.clear()
                self._e2e.clear()
            self._state = "backoff" if self._rate < cfg.max_rate else "steady"
        else:
            if self._rate < cfg.max_rate and now - self._last_raise >= cfg.recovery_interval_s:
                self._rate = min(cfg.max_rate, round(self._rate + cfg.increase_step, 9))
                self._last_raise = now
                self.raises += 1
            if self._rate >= cfg.max_rate:
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
