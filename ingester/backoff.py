"""Exponential backoff with jitter and a cap, for retrying a batch while the store is away."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Delay before retry number ``attempt`` (1 = first retry).

    ``initial * multiplier**(attempt-1)``, capped at ``cap``, then "equal jitter": a uniform
    pick in [delay/2, delay], so many ingesters that lost the store together do not come back
    in lock-step, yet each still waits at least half the nominal delay.
    """

    initial_s: float = 0.2
    cap_s: float = 10.0
    multiplier: float = 2.0
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        if self.initial_s <= 0 or self.cap_s < self.initial_s or self.multiplier < 1:
            raise ValueError(
                "backoff needs 0 < initial <= cap and multiplier >= 1, got"
                f" initial={self.initial_s} cap={self.cap_s} multiplier={self.multiplier}"
            )

    def nominal(self, attempt: int) -> float:
        if attempt < 1:
            raise ValueError(f"attempt counts from 1, got {attempt}")
        # Cap the exponent too, so a store away for days does not overflow a float.
        exp = min(attempt - 1, 64)
        return min(self.cap_s, self.initial_s * self.multiplier**exp)

    def delay(self, attempt: int) -> float:
        nominal = self.nominal(attempt)
        return self.rng.uniform(nominal / 2, nominal)
