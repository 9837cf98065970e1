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

from mirror import metrics as m
from mirror.headers import candidate_headers
from mirror.rewrite import candidate_request
from shadow_ab.privacy import redact_url
from shadow_ab.probes import SYNTHETIC_PROBE, ProbeSet, load_probe_set
from shadow_ab.records import Endpoint, Role

if TYPE_CHECKING:
    from mirror.config import ProbeConfig
    from mirror.exchange import ExchangeCore

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
MODELS_ROUTE = "/v1/models"


class ProbeInjector:
    """Sends the probes of one mirror through its exchange core's shadow side (see the module
    docstring). ``session``: the mirror's own session to the incumbent (the model lookup)."""

    def __init__(
        self,
        core: ExchangeCore,
        config: ProbeConfig,
        session: aiohttp.ClientSession | None,
        probes: ProbeSet | None = None,
        seed: int | None = None,
    ) -> None:
        self.core = core
        self.session = session
        self.config = config
        self.probes = probes or load_probe_set(config.set)
        self.rng = random.Random(seed)  # None: a random order per start (tests fix it)
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
        session = self.session
        url = self.core.settings.incumbent.bare_url.rstrip("/") + MODELS_ROUTE
        problem = ""
        try:
            if session is None:
                raise RuntimeError("the mirror has not started")
            async with session.get(
                url,
                headers={"accept-encoding": "identity", **dict(self.core.incumbent_own)},
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
        core = self.core
        if core.draining:
            return SKIPPED_DRAINING
        if not core.guard.admit(self.rng.random()):
            return SKIPPED_GUARD
        if core.shadows.inflight + 2 > core.settings.shadow.max_concurrent:
            return SKIPPED_CAP
        inflight = core.recorder.inflight
        if not core.settings.shadow.parity_allows(
            inflight[Role.CANDIDATE], inflight[Role.INCUMBENT]
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
        core = self.core
        inflight = core.recorder.inflight
        probe = self._next()
        pair = uuid.uuid4()
        body = probe.request(model or self.config.model)
        guard_state = core.guard.state()
        guard_state["decision"] = "probe"
        common = {
            "pair_id": pair,
            "endpoint": Endpoint.CHAT,
            "stream": False,
            "inflight_incumbent": inflight.incumbent_load(),
            "inflight_candidate": inflight[Role.CANDIDATE],
            "guard": guard_state,
            "capture": "full",
            "synthetic": SYNTHETIC_PROBE,
            "probe_id": self.probes.key(probe),
        }
        base = [("content-type", "application/json"), ("x-shadow-pair-id", str(pair))]
        cand_body, cand_rewrites = candidate_request(
            body, chat=True, rewrite=core.settings.candidate.rewrite
        )
        cand_headers = candidate_headers(base, core.candidate_forward, core.candidate_own)
        return [
            core.shadows.fire(
                Role.CANDIDATE, ROUTE, cand_body, cand_rewrites, cand_headers, common
            ),
            core.shadows.fire(Role.INCUMBENT, ROUTE, body, [], base + core.incumbent_own, common),
        ]
