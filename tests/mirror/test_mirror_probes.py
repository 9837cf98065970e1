"""Probes (``probes:``, mirror/probes.py): the mirror's synthetic pairs go to both engines,
marked in their records, within the shadow's budget, and the client's requests are unaffected.
In-process mirror against two quick simulators, records in a list sink."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from mirror_helpers import (
    FAST,
    MODEL,
    ListSink,
    StandInEngine,
    chat_answer,
    normalize,
    served_in_process,
)

from mirror.app import Mirror
from mirror.config import MirrorSettings, load_settings
from mirror.errors import MirrorConfigError
from mirror.probes import (
    SENT,
    SKIPPED_CAP,
    SKIPPED_DRAINING,
    SKIPPED_GUARD,
    SKIPPED_LOAD_PARITY,
    ProbeInjector,
)
from shadow_ab.dev.processes import RunningSim, running_sim
from shadow_ab.probes import load_probe_set
from shadow_ab.records import ExchangeRecord, Role


@pytest.fixture(scope="module")
def sims() -> Iterator[tuple[RunningSim, RunningSim]]:
    with (
        running_sim("vllm", "clean", overrides=FAST, ledger=False) as inc,
        running_sim(
            "vllm",
            "clean",
            overrides={**FAST, "quality": {"probe_accuracy": 0.5, "broken_json": 0.5}},
        ) as cand,
    ):
        yield inc, cand


def settings(sims: tuple[RunningSim, RunningSim], **over: Any) -> MirrorSettings:
    inc, cand = sims
    shadow = over.pop("shadow", {})
    path = over.pop("incumbent_path", "")
    return load_settings(
        None,
        incumbent={"url": inc.base_url + path},
        candidate={"url": cand.base_url, "flavor": "vllm"},
        health_enabled=False,
        database_url="sqlite:///unused.db",
        guard={"enabled": False},
        shadow={"rate": 1.0, **shadow},
        **over,
    )


BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "tell me about the sea"}],
    "max_tokens": 12,
    "temperature": 0,
    "stream": True,
}


async def traffic(mirror: Mirror, n: int, settle_s: float) -> list[bytes]:
    async with served_in_process(mirror) as client:
        bodies = []
        for _ in range(n):
            resp = await client.post("/v1/chat/completions", json=BODY)
            assert resp.status_code == 200
            bodies.append(resp.content)
        await asyncio.sleep(settle_s)
        return bodies


def test_probes_reach_both_engines_marked_and_the_client_is_unaffected(
    sims: tuple[RunningSim, RunningSim],
) -> None:
    inc, cand = sims
    direct = httpx.post(inc.base_url + "/v1/chat/completions", json=BODY, timeout=10).content
    inc_model = httpx.get(inc.base_url + "/v1/models", timeout=10).json()["data"][0]["id"]
    sink = ListSink()
    mirror = Mirror(settings(sims, probes={"per_minute": 600}), sink=sink)
    bodies = asyncio.run(traffic(mirror, 10, settle_s=1.0))
    # The client's bytes are the incumbent's, probes or not.
    assert all(normalize(b) == normalize(direct) for b in bodies)

    records = [r for r in sink.records if isinstance(r, ExchangeRecord)]
    client = [r for r in records if r.synthetic is None]
    probes = [r for r in records if r.synthetic == "probe"]
    # Client traffic: every request recorded once per role, none marked.
    assert sum(r.role is Role.INCUMBENT for r in client) == 10
    assert all(r.probe_id is None for r in client)
    # Probes: pairs of one incumbent and one candidate answer to the same probe, marked.
    assert len(probes) >= 4
    pairs: dict[Any, list[ExchangeRecord]] = defaultdict(list)
    for r in probes:
        pairs[r.pair_id].append(r)
    shipped = load_probe_set()
    for pair in pairs.values():
        roles = sorted(r.role.value for r in pair)
        if len(pair) < 2:  # the last probe may still be in flight at shutdown
            assert pair[0].status.value in ("ok", "cancelled")
            continue
        assert roles == ["candidate", "incumbent"]
        assert pair[0].probe_id == pair[1].probe_id
        probe = shipped.lookup(pair[0].probe_id or "")
        assert probe is not None
        for r in pair:
            assert r.status.value == "ok" and r.stream is False
            assert r.request["messages"][-1]["content"] == probe.prompt
            assert r.guard["decision"] == "probe"
            assert r.output_text  # the simulator answered it
            # no probes.model: the first model the incumbent's /v1/models lists
            assert r.request["model"] == inc_model
    # No client pair holds a probe's record.
    client_pairs = {r.pair_id for r in client}
    assert not client_pairs & set(pairs)
    # The candidate simulator's ledger says which answers it made wrong: the probe's check of
    # each recorded answer agrees, answer by answer (simulator -> mirror -> record -> check).
    drawn = {line["pair_id"]: line for line in cand.ledger() if line["event"] == "probe"}
    answered = [r for r in probes if r.role is Role.CANDIDATE and r.status.value == "ok"]
    assert answered and {str(r.pair_id) for r in answered} <= set(drawn)
    for r in answered:
        probe = shipped.lookup(r.probe_id or "")
        assert probe is not None
        line = drawn[str(r.pair_id)]
        assert line["probe_id"] == r.probe_id and line["accuracy"] == 0.5
        assert probe.check(r.output_text) is line["correct"]


class _Guard:
    def __init__(self, admit: bool) -> None:
        self._admit = admit

    def admit(self, u: float) -> bool:
        return self._admit

    def state(self) -> dict[str, Any]:
        return {}


def test_probes_take_the_shadow_budget_never_more(sims: tuple[RunningSim, RunningSim]) -> None:
    """The guard, the shadow cap (a probe is two shadow requests) and load parity each turn a
    probe away, as they would a client's shadow request; so does draining."""
    sink = ListSink()
    m = Mirror(settings(sims, probes={"per_minute": 1}), sink=sink)
    inj = ProbeInjector(m.core, m.settings.probes, None)
    assert inj.decide() == SENT
    m.core.guard = _Guard(False)  # type: ignore[assignment]
    assert inj.decide() == SKIPPED_GUARD
    assert inj.tick() == []
    m.core.guard = _Guard(True)  # type: ignore[assignment]

    capped = Mirror(
        settings(sims, probes={"per_minute": 1}, shadow={"max_concurrent": 1}), sink=sink
    )
    assert ProbeInjector(capped.core, capped.settings.probes, None).decide() == SKIPPED_CAP
    m.shadows.inflight = m.settings.shadow.max_concurrent - 1
    assert inj.decide() == SKIPPED_CAP
    m.shadows.inflight = 0

    parity = Mirror(
        settings(sims, probes={"per_minute": 1}, shadow={"load_parity": 1.0}), sink=sink
    )
    parity.recorder.inflight.counts[Role.CANDIDATE] = 3
    assert ProbeInjector(parity.core, parity.settings.probes, None).decide() == SKIPPED_LOAD_PARITY

    m.core.draining = True
    assert inj.decide() == SKIPPED_DRAINING
    assert sink.records == []


def test_a_bad_probe_set_stops_the_mirror_at_start_naming_the_line(
    sims: tuple[RunningSim, RunningSim], tmp_path: Path
) -> None:
    bad = tmp_path / "probes.jsonl"
    bad.write_text(
        '{"id": "a", "kind": "arithmetic", "prompt": "1+1?", "answer": "2"}\n'
        '{"id": "b", "kind": "arithmetic", "prompt": "2+2?"}\n'
    )
    with pytest.raises(MirrorConfigError) as err:
        settings(sims, probes={"per_minute": 1, "set": str(bad)})
    assert "line 2" in str(err.value) and "answer" in str(err.value)
    # On by default (one a minute), so a missing file stops the mirror at start too...
    assert settings(sims).probes.per_minute == 1
    missing = str(tmp_path / "missing.jsonl")
    with pytest.raises(MirrorConfigError) as err:
        settings(sims, probes={"set": missing})
    assert "missing.jsonl" in str(err.value)
    # ...while off, the set is not read.
    assert settings(sims, probes={"per_minute": 0, "set": missing}).probes.per_minute == 0


def test_without_a_model_name_probes_are_skipped_not_sent_without_one(
    sims: tuple[RunningSim, RunningSim],
) -> None:
    """An incumbent whose /v1/models cannot be read gives no model name: the tick is skipped
    (an engine that requires ``model`` would fail every probe, counted against the candidate);
    ``probes.model`` names it outright."""
    sink = ListSink()
    # /nowhere/v1/models: 404
    m = Mirror(settings(sims, probes={"per_minute": 1}, incumbent_path="/nowhere"), sink=sink)

    async def ask(mirror: Mirror) -> tuple[str | None, str | None]:
        await mirror.startup()
        try:
            session = mirror.passthrough.session
            inj = ProbeInjector(mirror.core, mirror.settings.probes, session)
            named = ProbeInjector(
                mirror.core, mirror.settings.probes.model_copy(update={"model": "llama"}), session
            )
            return await inj.model_name(), await named.model_name()
        finally:
            await mirror.shutdown()

    assert asyncio.run(ask(m)) == (None, "llama")
    assert sink.records == []


class LockedEngine(StandInEngine):
    """An engine behind an API key (vLLM's ``--api-key``): 401 without ``Bearer <key>``; with
    it, /v1/models lists one model and chat completions answer. Keeps the Authorization
    header of every request."""

    KEY = "s3cret"

    def __init__(self) -> None:
        super().__init__()
        self.auth: list[str | None] = []

    def _locked(self, request: web.Request) -> bool:
        self.auth.append(request.headers.get("Authorization"))
        return request.headers.get("Authorization") != f"Bearer {self.KEY}"

    async def _models(self, request: web.Request) -> web.Response:
        if self._locked(request):
            return web.json_response({"error": "unauthorized"}, status=401)
        return web.json_response({"object": "list", "data": [{"id": MODEL}]})

    async def _chat(self, request: web.Request) -> web.Response:
        await request.read()
        if self._locked(request):
            return web.json_response({"error": "unauthorized"}, status=401)
        return web.json_response(chat_answer("4", prompt_tokens=5))

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)


def test_probes_to_an_incumbent_behind_an_api_key_carry_its_own_headers(
    sims: tuple[RunningSim, RunningSim],
) -> None:
    """``incumbent.headers`` (values, ``{env: ...}`` or ``{file: ...}``) go on the mirror's own
    requests to the incumbent: the model lookup and the probes succeed against an engine that
    requires a key, and the candidate never sees the incumbent's key."""
    _, cand = sims
    sink = ListSink()
    with LockedEngine() as inc:
        s = load_settings(
            None,
            incumbent={"url": inc.url, "headers": {"Authorization": f"Bearer {inc.KEY}"}},
            candidate={"url": cand.base_url, "flavor": "vllm"},
            health_enabled=False,
            database_url="sqlite:///unused.db",
            guard={"enabled": False},
            probes={"per_minute": 1},
        )
        m = Mirror(s, sink=sink)

        async def probe(mirror: Mirror) -> str | None:
            await mirror.startup()
            try:
                inj = ProbeInjector(mirror.core, mirror.settings.probes, mirror.passthrough.session)
                model = await inj.model_name()
                await asyncio.gather(*inj.tick(model))
                return model
            finally:
                await mirror.shutdown()

        assert asyncio.run(probe(m)) == MODEL
        assert inc.auth and set(inc.auth) == {f"Bearer {inc.KEY}"}
    by_role = {r.role: r for r in sink.records if isinstance(r, ExchangeRecord)}
    assert by_role[Role.INCUMBENT].http_status == 200
    assert by_role[Role.INCUMBENT].output_text == "4"
    assert by_role[Role.CANDIDATE].http_status == 200
    assert inc.KEY not in str(by_role[Role.CANDIDATE].request)
