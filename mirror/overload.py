"""The mirror's own overload: shadowing scales down while its event loop lags.

The client's bytes and the shadow side's work (the candidate's and the replay's streams, both
streams parsed, the records built and handed to the sink) share one event loop. When the
mirror's process is short of CPU (more streams than one core serves, or a machine whose other
work takes the cores), every callback waits behind the others, and the client's chunks wait
too: at 32 streams on two busy cores the shadowing mirror added +56 ms TTFT p50 where it added
+6 ms with shadowing off (mirror/README.md, "The mirror's own overload"). The shadow side is
the one part of that work the mirror may drop.

:class:`LoopLag` measures how late a periodic timer fires (``interval_ms``): the time a
callback that became ready waited for the loop, the same wait the client's next chunk has. The
loop's lag is the largest lateness over the last ``window_s``. Like Envoy's overload manager's
scaled triggers, it maps that lag to a fraction of sampled requests still shadowed: all of them
up to ``scaled_lag_ms``, none from ``saturated_lag_ms``, linear between. A request turned away
is counted as ``skipped_overload`` and its records say so (``guard.decision``), as the
interference guard's are. The fraction is applied to the same uniform draw as the guard's
rate, so the two nest: a request is shadowed when its draw is under both.

What it does not do: slow or refuse the client's requests (only shadow work is shed), or stop
a shadow request already sent. Probes (one a minute) are not shed. Shedding by the loop's lag
makes the shadowed pairs lean to the mirror's quieter moments: the records name every skipped
pair, and the decisions' counts say how many.

The lag is measured whether or not shedding is ``enabled`` (``shadow_ab_mirror_loop_lag_seconds``,
``shadow_ab_mirror_overload_admit_ratio``): an operator sees the mirror's own queueing before
turning shedding on.

Not thread-safe: the mirror calls it from its event loop only.

Errors: none at run time; :class:`LoopLag` raises ValueError unless ``saturated_lag_ms``
exceeds ``scaled_lag_ms``.
"""

from __future__ import annotations

import asyncio
from collections import deque

from pydantic import BaseModel, ConfigDict, Field

from mirror.metrics import LOOP_LAG, OVERLOAD_ADMIT

INTERVAL_MS = 50.0
"""How often the loop's lag is measured: 20 timer callbacks a second cost nothing measurable and
see every stall of 50 ms or more (issue 26: a constant)."""
WINDOW_S = 1.0
"""The loop's lag is the largest timer lateness over this window: one second reacts within a
second and forgets a single stall as fast."""
SCALED_LAG_MS = 10.0
"""Above this lag fewer sampled requests are shadowed: 10 ms is where the client's TTFT started
to move in the measurements (mirror/README.md, "The mirror's own overload")."""
SATURATED_LAG_MS = 50.0
"""From this lag on no request is shadowed (linear between the two)."""


class OverloadConfig(BaseModel):
    """Settings of the mirror's own overload shedding (``overload:`` in the mirror's YAML); the
    lag's thresholds are the module's constants."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        default=False,
        description="scale shadowing down while the mirror's event loop lags (the lag is"
        " measured either way)",
    )


class LoopLag:
    """The event loop's lag and the fraction of sampled requests it allows (:attr:`admit_ratio`).

    :meth:`start` arms the timer on the running loop, :meth:`stop` disarms it;
    :meth:`observe` is the timer's arithmetic, callable with any times (tests)."""

    def __init__(
        self,
        config: OverloadConfig,
        *,
        interval_ms: float = INTERVAL_MS,
        window_s: float = WINDOW_S,
        scaled_lag_ms: float = SCALED_LAG_MS,
        saturated_lag_ms: float = SATURATED_LAG_MS,
    ) -> None:
        if saturated_lag_ms <= scaled_lag_ms:
            raise ValueError(
                f"saturated_lag_ms ({saturated_lag_ms:g}) must be larger than scaled_lag_ms"
                f" ({scaled_lag_ms:g})"
            )
        self.config = config
        self.interval_s = interval_ms / 1000.0
        self.window_s = window_s
        self._scaled = scaled_lag_ms / 1000.0
        self._saturated = saturated_lag_ms / 1000.0
        self._recent: deque[tuple[float, float]] = deque()
        self.lag_s = 0.0
        """The largest lateness over the last ``window_s``."""
        self.ratio = 1.0
        """The fraction the lag allows, whether or not shedding is enabled."""
        self.admit_ratio = 1.0
        """The fraction of sampled requests shadowed now: :attr:`ratio` when enabled, else 1."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._due = 0.0
        self._handle: asyncio.TimerHandle | None = None
        OVERLOAD_ADMIT.set(1.0)

    def admit(self, u: float) -> bool:
        """May a sampled request be shadowed? ``u`` is uniform in [0, 1) (the guard's draw)."""
        return u < self.admit_ratio

    def observe(self, now: float, late_s: float) -> None:
        """One tick that fired ``late_s`` seconds after it was due, at ``now``."""
        LOOP_LAG.observe(late_s)
        recent = self._recent
        # Only the largest lateness can matter, so a lateness below a later one is never kept.
        while recent and recent[-1][1] <= late_s:
            recent.pop()
        recent.append((now, late_s))
        horizon = now - self.window_s
        while recent[0][0] < horizon:
            recent.popleft()
        lag = recent[0][1]
        self.lag_s = lag
        if lag <= self._scaled:
            ratio = 1.0
        elif lag >= self._saturated:
            ratio = 0.0
        else:
            ratio = (self._saturated - lag) / (self._saturated - self._scaled)
        self.ratio = ratio
        admit = ratio if self.config.enabled else 1.0
        if admit != self.admit_ratio:
            self.admit_ratio = admit
            OVERLOAD_ADMIT.set(admit)

    def start(self) -> None:
        """Arm the timer on the running loop (again after :meth:`stop`)."""
        self.stop()
        self._loop = asyncio.get_running_loop()
        self._due = self._loop.time() + self.interval_s
        self._handle = self._loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        loop = self._loop
        assert loop is not None
        now = loop.time()
        self.observe(now, max(0.0, now - self._due))
        self._due = now + self.interval_s
        self._handle = loop.call_at(self._due, self._tick)
