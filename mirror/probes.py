"""Probe injection: the mirror's own synthetic traffic, a labelled prompt to both engines.

At ``probes.per_minute`` (default 1; 0: off) the mirror picks the next probe of its probe set
(``probes.set``: the shipped one or a JSON-lines file, :mod:`shadow_ab.probes`) and sends it,
as one pair, to the incumbent and to the candidate at the same moment: greedy, not streamed,
``max_tokens`` from the probe. On by default so that the default policy's probe criterion is
measured out of the box; what it costs the GPUs is in mirror/README.md ("Probes").

**The model name**: ``probes.model``, else the first model the incumbent's ``GET /v1/models``
lists (asked before the first probe, again after a failure; the candidate's copy gets the
candidate rewrites, ``model`` included, as a client's request would). Without a name the tick is
skipped (``skipped_no_model``): an engine that requires ``model`` (TensorRT-LLM's
``trtllm-serve`` does) would otherwise fail every probe, and count those failures against the
candidate. No client sends it and no client sees its answer. Its two
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

import aiohttp
import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

from mirror import metrics as m
from mirror.headers import candidate_headers
from mirror.rewrite import candidate_request
from shadow_ab.privacy import redact_url
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
SKIPPED_NO_MODEL = "skipped_no_model"
DECISIONS = (
    SENT,
    SKIPPED_GUARD,
    SKIPPED_CAP,
    SKIPPED_LOAD_PARITY,
    SKIPPED_DRAINING,
    SKIPPED_NO_MODEL,
)
DEFAULT_PER_MINUTE = 1.0
"""One probe pair a minute per mirror process: 1,440 a day, each of the shipped 300 probes asked
about five times a day (greedy answers repeat, so more buys little: the probes, not the sends,
are the unit); the GPU arithmetic is in mirror/README.md."""
MODELS_ROUTE = "/v1/models"


class ProbeConfig(BaseModel):
    """``probes:`` in the mirror's settings."""

    model_config = ConfigDict(extra="forbid")

    per_minute: float = Field(
        default=DEFAULT_PER_MINUTE,
        ge=0,
        le=600,
        description="probes sent to both engines per minute per mirror process (0: off); each"
        " is one pair of the shadow's budget",
    )
    set: str = Field(
        default="default",
        description="the probe set: 'default' (shipped, 300 probes) or a JSON-lines file"
        " (format: shadow_ab/probes.py)",
    )
    model: str | None = Field(
        default=None,
        description="model name of the probe requests (the candidate's is rewritten as a"
        " client's would be); none: the first model the incumbent's /v1/models lists",
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
        self._model: str | None = config.model
        self._warned = False

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
                model = await self.model_name()
                if model is None:
                    self._m[SKIPPED_NO_MODEL].inc()
                    continue
                self.tick(model)
            except Exception:
                log.exception("a probe could not be sent")

    async def model_name(self) -> str | None:
        """``probes.model``, else the first id of the incumbent's ``/v1/models`` (remembered
        once found; None while it cannot be read, with one warning saying what to set)."""
        if self._model is not None:
            return self._model
        session = self.mirror.incumbent_session
        url = self.mirror.inc_url.rstrip("/") + MODELS_ROUTE
        problem = ""
        try:
            if session is None:
                raise RuntimeError("the mirror has not started")
            async with session.get(
                url,
                headers={"accept-encoding": "identity", **dict(self.mirror._inc_own)},
                timeout=aiohttp.ClientTimeout(total=5.0),
            ) as resp:
                body = await resp.read()
                if resp.status != 200:
                    problem = f"HTTP {resp.status}"
                else:
                    data = orjson.loads(body).get("data") or []
                    first = data[0].get("id") if data and isinstance(data[0], dict) else None
                    if isinstance(first, str) and first:
                        self._model = first
                    else:
                        problem = "no model listed"
        except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError, AttributeError) as e:
            problem = f"{type(e).__name__}: {e}"
        if problem and not self._warned:
            self._warned = True
            log.warning(
                "probes skipped: no model name (%s from %s); set probes.model to the model the"
                " clients ask for",
                problem,
                redact_url(url),
            )
        return self._model

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

    def tick(self, model: str | None = None) -> list[asyncio.Task[None]]:
        """One probe to both engines, if the shadow's rules allow; the tasks fired. ``model``:
        the requests' model name (default ``probes.model``)."""
        decision = self.decide()
        self._m[decision].inc()
        if decision != SENT:
            return []
        mirror = self.mirror
        probe = self._next()
        pair = uuid.uuid4()
        body = probe.request(model or self.config.model)
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
            mirror.shadows.fire(Role.INCUMBENT, ROUTE, body, [], base + mirror._inc_own, common),
        ]
