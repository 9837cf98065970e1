"""Which client requests are shadowed: a fraction, consistent by a header, and replays.

A request draws ``u`` in [0, 1): from the hash of a configured header's value when the request
carries it (a session id: the same value always draws the same ``u``, so whole conversations
are in or out), else at random. It is sampled when ``u < rate``; ``u / rate`` -- again uniform
in [0, 1) among the sampled, and still consistent per session -- is what the interference
guard's ``admit`` gets, so backing off also drops whole sessions. A sampled request is also
replayed to the incumbent (role ``replay``, its own noise floor) with probability
``replay_rate``.

Pure; the random source is injectable. Errors: none.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field, field_validator

_SCALE = float(2**64)


LOAD_PARITY_SLACK = 0
"""Candidate requests in flight allowed beyond ``load_parity`` x the incumbent's: none, so the
bound is the ratio itself (a setting until issue 26; nobody set it). Replays always go through
their own connection pool to the incumbent and carry a random ``cache_salt`` (settings
``replay_pool`` and ``replay_cache_salt`` until issue 26): :mod:`mirror.shadow`."""


class ShadowConfig(BaseModel):
    """How much traffic is shadowed (``shadow:`` in the mirror's YAML)."""

    model_config = ConfigDict(extra="forbid")

    rate: float = Field(default=1.0, ge=0.0, le=1.0, description="fraction of requests shadowed")
    header: str | None = Field(
        default=None,
        description="sample consistently by this request header's value (e.g. x-session-id):"
        " the same value is always in or always out",
    )
    max_concurrent: int = Field(
        default=64,
        ge=0,
        description="most shadow requests (candidate + replay) in flight; past it, requests are"
        " not shadowed (counted as skipped_cap), never queued",
    )
    timeout_s: float = Field(
        default=120.0, gt=0, description="a shadow request is abandoned (status timeout) after"
    )
    replay_rate: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="fraction of shadowed requests also sent again to the incumbent (replay)",
    )
    load_parity: float | None = Field(
        default=None,
        gt=0.0,
        le=1000.0,
        description="bound the candidate's requests in flight at dispatch to this ratio of the"
        " incumbent's client requests in flight (plus LOAD_PARITY_SLACK), this request counted on"
        " both sides; past it, requests are not shadowed (counted as skipped_load_parity), so"
        " both engines are compared at the same concurrency. None: no bound",
    )
    replay_delay_s: float = Field(
        default=1.0,
        ge=0.0,
        le=60.0,
        description="a replay waits this long before it is sent, so it is not batched with the"
        " request it repeats and measures the incumbent's run-to-run variation (recorded as the"
        " replay's rewrite replay_delay:<s>); 0: sent at once",
    )
    top_logprobs: int | None = Field(
        default=5,
        ge=1,
        le=20,
        description="the candidate and the replay (never the client's request) are asked for this"
        " many top logprobs per token where the request did not ask for them (recorded as the"
        " rewrite logprobs), for the near-tie margin; null: never",
    )

    def parity_allows(
        self, inflight_candidate: int, inflight_incumbent: int, slack: int | None = None
    ) -> bool:
        """Whether one more candidate request keeps ``load_parity``: with this request on both
        sides, ``candidate + 1 <= load_parity * (incumbent + 1) + slack`` (default
        :data:`LOAD_PARITY_SLACK`)."""
        ratio = self.load_parity
        if ratio is None:
            return True
        if slack is None:
            slack = LOAD_PARITY_SLACK
        return inflight_candidate + 1 <= ratio * (inflight_incumbent + 1) + slack

    @field_validator("header")
    @classmethod
    def _lower(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        if any(c in v for c in " \t:\r\n"):
            raise ValueError(f"shadow.header {v!r} is not a header name (no spaces or colons)")
        return v.strip().lower()


def header_draw(value: bytes) -> float:
    """A stable uniform draw in [0, 1) from a header value."""
    digest = hashlib.blake2b(value, digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SCALE


class Sampler:
    """Draws and decides; one per mirror."""

    def __init__(self, config: ShadowConfig, rng: Callable[[], float] = random.random) -> None:
        self.config = config
        self._rng = rng
        self.header = config.header.encode("latin-1") if config.header else None

    def draw(self, header_value: bytes | None) -> float:
        """``u`` for one request: from the header value when given, else random."""
        if header_value is not None:
            return header_draw(header_value)
        return self._rng()

    def sampled(self, u: float) -> bool:
        return u < self.config.rate

    def guard_draw(self, u: float) -> float:
        """``u`` rescaled among the sampled (uniform in [0, 1)) for the guard's ``admit``."""
        rate = self.config.rate
        return min(u / rate, 0.999999999) if rate > 0 else 1.0

    def replay(self) -> bool:
        r = self.config.replay_rate
        return r > 0.0 and self._rng() < r
