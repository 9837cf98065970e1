"""Probe injection: the mirror's own synthetic traffic, a labelled prompt to both engines.

At ``probes.per_minute`` (default 0: off) the mirror picks the next probe of its probe set
(``probes.set``: the shipped one or a JSON-lines file, :mod:`shadow_ab.probes`) and sends it,
as one pair, to the incumbent and to the candidate at the same moment: greedy, not streamed,
``max_tokens`` from the probe. No client sends it and no client sees its answer. Its two
records carry ``synthetic: "probe"`` and ``probe_id``; the evaluator leaves them out of every
client figure and scores them (``evaluator/quality.py``).

**Probes take the shadow's budget, never the client's**: they go out through the shadow
dispatch (:meth:`mirror.shadow.Shadows.fire`: tasks the client's path never awaits), only when
the interference guard admits a shadow request, when both fit under ``shadow.max_concurrent``
with the shadow requests in flight, and when load parity allows one more candidate request;
otherwise the tick is skipped and counted (``shadow_ab_mirror_probes_total{decision}``). The
incumbent's probe is timed and recorded like a replay (on the incumbent's connection pool).
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mirror import metrics as m
from mirror.headers import candidate_headers
from mirror.rewrite import candidate_request
from shadow_ab.probes import SYNTHETIC_PROBE, ProbeSet, ProbeSetError, load_probe_set
from shadow_ab.records import Endpoint, Role

if TYPE_CHECKING:
    from mirror.app import Mirror

log = logging.getLogger(__name__)

ROUTE = "/v1/chat/completions"
SENT = "sent"
SKIPPED_GUARD = "skipped_guard"
SKIPPED_CAP = "skipped_cap"
SKIPPED_LOAD_PARITY = "skipped_load_parity"
SKIPPED_DRAINING = "skipped_draining"
DECISIONS = (SENT, SKIPPED_GUARD, SKIPPED_CAP, SKIPPED_LOAD_PARITY, SKIPPED_DRAINING)


class ProbeConfig(BaseModel):
    """``probes:`` in the mirror's settings."""

    model_config = ConfigDict(extra="forbid")

    per_minute: float = Field(
        default=0.0,
        ge=0,
        le=600,
        description="probes sent to both engines per minute (0: off); each is one pair of the"
        " shadow's budget",
    )
    set: str = Field(
        default="default",
        description="the probe set: 'default' (shipped, 300 probes) or a JSON-lines file"
        " (format: shadow_ab/probes.py)",
    )
    model: str | None = Field(
        default=None,
        description="model name of the probe requests (the candidate's is rewritten as a"
        " client's would be); none: the engines' default model",
    )
    seed: int | None = Field(
        default=None, description="order of the probes (none: a random order per start)"
    )

    @model_validator(mode="after")
    def _loadable(self) -> ProbeConfig:
        if self.per_minute > 0:
            try:
                load_probe_set(self.set)
            except ProbeSetError as exc:
                raise ValueError(f"probes.set: {exc}") from None
        return self


class ProbeInjector:
    """Sends the probes of one :class:`~mirror.app.Mirror` (see the module docstring)."""

    def __init__(self, mirror: Mirror, config: ProbeConfig, probes: ProbeSet | None = None) -> None:
        self.mirror = mirror
        self.config = config
        self.probes = probes or load_probe_set(config.set)
        self.rng = random.Random(config.seed)
        self._order: list[int] = []
        self._m = {d: m.PROBES.labels(decision=d) for d in DECISIONS}

    def _next(self) -> Any:
        if not self._order:
            self._order = list(range(len(self.probes.probes)))
            self.rng.shuffle(self._order)
        return self.probes.probes[self._order.pop()]

    async def run(self) -> None:
        """Tick at ``per_minute`` (each interval drawn uniform in 0.5-1.5 x the mean, so
        probes do not line up with periodic client load) until cancelled."""
        mean = 60.0 / self.config.per_minute
        while True:
            await asyncio.sleep(mean * self.rng.uniform(0.5, 1.5))
            try:
                self.tick()
            except Exception:
                log.exception("a probe could not be sent")

    def decide(self) -> str:
        """Whether a probe may go out now, by the shadow's own rules."""
        mirror = self.mirror
        if mirror.draining:
            return SKIPPED_DRAINING
        if not mirror.guard.admit(self.rng.random()):
            return SKIPPED_GUARD
        if mirror.shadows.inflight + 2 > mirror.settings.shadow.max_concurrent:
            return SKIPPED_CAP
        if not mirror.settings.shadow.parity_allows(
            mirror._inflight[Role.CANDIDATE], mirror._inflight[Role.INCUMBENT]
        ):
            return SKIPPED_LOAD_PARITY
        return SENT

    def tick(self) -> list[asyncio.Task[None]]:
        """One probe to both engines, if the shadow's rules allow; the tasks fired."""
        decision = self.decide()
        self._m[decision].inc()
        if decision != SENT:
            return []
        mirror = self.mirror
        probe = self._next()
        pair = uuid.uuid4()
        body = probe.request(self.config.model)
        guard_state = mirror.guard.state()
        guard_state["decision"] = "probe"
        common = {
            "pair_id": pair,
            "endpoint": Endpoint.CHAT,
            "stream": False,
            "inflight_incumbent": mirror._inflight[Role.INCUMBENT] + mirror._inflight[Role.REPLAY],
            "inflight_candidate": mirror._inflight[Role.CANDIDATE],
            "guard": guard_state,
            "capture": "full",
            "synthetic": SYNTHETIC_PROBE,
            "probe_id": self.probes.key(probe),
        }
        base = [("content-type", "application/json"), ("x-shadow-pair-id", str(pair))]
        cand_body, cand_rewrites = candidate_request(
            body, chat=True, rewrite=mirror.settings.candidate.rewrite
        )
        cand_headers = candidate_headers(base, mirror._cand_forward, mirror._cand_extra)
        return [
            mirror.shadows.fire(
                Role.CANDIDATE, ROUTE, cand_body, cand_rewrites, cand_headers, common
            ),
            mirror.shadows.fire(Role.INCUMBENT, ROUTE, body, [], base, common),
        ]
