"""The shadow path in-process: sampling, consistent header sampling, replay, the cap, the guard
and candidate rewrites, against simulator engines; records collected by a list sink."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from typing import Any

import httpx
import pytest
from mirror_helpers import MODEL, ListSink, served_in_process

from mirror.app import Mirror
from mirror.config import MirrorSettings, load_settings
from mirror.guard import GuardConfig, InterferenceGuard
from mirror.sampling import Sampler, header_draw
from shadow_ab.dev.processes import RunningSim
from shadow_ab.records import ExchangeRecord, Role, Status


def settings(engines: tuple[RunningSim, RunningSim], **over: Any) -> MirrorSettings:
    inc, cand = engines
    cand_over = over.pop("candidate", {})
    return load_settings(
        None,
        incumbent={"url": inc.base_url},
        candidate={"url": cand.base_url, **cand_over},
        health_enabled=False,
        database_url="sqlite:///unused.db",
        **over,
    )


def chat(i: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"question {i}"}],
        "max_tokens": 6,
        "temperature": 0,
        **extra,
    }


async def drive(
    mirror: Mirror, requests: list[tuple[dict[str, Any], dict[str, str]]], *, concurrent: bool
) -> list[httpx.Response]:
    """Send requests through the in-process mirror; then drain it (shadows
    finish)."""
    async with served_in_process(mirror) as client:
        calls = [client.post("/v1/chat/completions", json=b, headers=h) for b, h in requests]
        if concurrent:
            return list(await asyncio.gather(*calls))
        return [await c for c in calls]


def by_role(records: list[Any]) -> Counter[Role]:
    return Counter(r.role for r in records if isinstance(r, ExchangeRecord))


def test_consistent_header_sampling_and_replay_fraction(
    engines: tuple[RunningSim, RunningSim],
) -> None:
    s = settings(engines, shadow={"rate": 0.5, "header": "x-session-id", "replay_rate": 0.5})
    sink = ListSink()
    replay_draws = itertools.cycle([0.1, 0.9])  # every other sampled request is replayed
    mirror = Mirror(s, sink=sink, sampler=Sampler(s.shadow, rng=lambda: next(replay_draws)))
    sessions = [f"session-{i}" for i in range(12)]
    reqs = [(chat(i), {"x-session-id": sid}) for i, sid in enumerate(sessions * 2)]
    responses = asyncio.run(drive(mirror, reqs, concurrent=False))
    assert all(r.status_code == 200 for r in responses)

    pair_session = {
        r.headers["x-shadow-pair-id"]: sid for r, sid in zip(responses, sessions * 2, strict=True)
    }
    records = [r for r in sink.records if isinstance(r, ExchangeRecord)]
    shadowed = Counter(pair_session[str(r.pair_id)] for r in records if r.role is Role.CANDIDATE)
    expected = {sid for sid in sessions if header_draw(sid.encode()) < 0.5}
    assert 0 < len(expected) < len(sessions)  # the test means something with these ids
    assert set(shadowed) == expected  # whole sessions in or out...
    assert set(shadowed.values()) == {2}  # ...both requests of each
    counts = by_role(records)
    assert counts[Role.INCUMBENT] == 24
    assert counts[Role.REPLAY] == len(expected)  # half of the 2 * len(expected) sampled
    assert all(r.status is Status.OK for r in records)
    replays = [r for r in records if r.role is Role.REPLAY]
    assert all(r.engine == "vllm@incumbent" for r in replays)


def test_cap_skips_instead_of_queueing(engines: tuple[RunningSim, RunningSim]) -> None:
    s = settings(engines, shadow={"max_concurrent": 2})
    sink = ListSink()
    mirror = Mirror(s, sink=sink)
    long = {"max_tokens": 60, "ignore_eos": True}
    reqs: list[tuple[dict[str, Any], dict[str, str]]] = [(chat(i, **long), {}) for i in range(7)]
    responses = asyncio.run(drive(mirror, reqs, concurrent=True))
    assert [r.status_code for r in responses] == [200] * 7
    counts = by_role(sink.records)
    assert counts[Role.INCUMBENT] == 7
    assert counts[Role.CANDIDATE] == 2


def test_guard_off_window_admits_nothing_and_its_state_is_recorded(
    engines: tuple[RunningSim, RunningSim],
) -> None:
    cfg = GuardConfig(off_window_every_s=100.0, off_window_s=99.0)
    s = settings(engines, guard=cfg.model_dump())
    # created at 0, then 50 s into every 100 s period: inside the off window
    now = itertools.chain([0.0], itertools.count(50.0, 0.001))
    guard = InterferenceGuard(cfg, clock=lambda: next(now))
    sink = ListSink()
    mirror = Mirror(s, sink=sink, guard=guard)
    asyncio.run(drive(mirror, [(chat(i), {}) for i in range(3)], concurrent=False))
    records = [r for r in sink.records if isinstance(r, ExchangeRecord)]
    assert by_role(records) == Counter({Role.INCUMBENT: 3})
    assert {r.guard["state"] for r in records} == {"off_window"}


@pytest.mark.parametrize("drop", [True, False])
def test_candidate_rewrites_are_recorded(
    engines: tuple[RunningSim, RunningSim], drop: bool
) -> None:
    # vLLM ignores a field it does not know; TensorRT-LLM answers 400 unless the field is dropped
    rewrite: dict[str, Any] = {"model_map": {"*": "trt-engine-model"}}
    if drop:
        rewrite["drop_fields"] = ["guided_choice"]
    s = settings(engines, candidate={"rewrite": rewrite})
    sink = ListSink()
    body = chat(1, guided_choice=["a", "b"], stream=True)
    asyncio.run(drive(Mirror(s, sink=sink), [(body, {})], concurrent=False))
    recs = {r.role: r for r in sink.records if isinstance(r, ExchangeRecord)}
    inc, cand = recs[Role.INCUMBENT], recs[Role.CANDIDATE]
    assert inc.status is Status.OK and inc.model == MODEL
    assert inc.rewrites == ["stream_options.include_usage"]
    assert cand.model == "trt-engine-model"
    if drop:
        assert cand.rewrites == [
            "model",
            "drop:guided_choice",
            "stream_options.include_usage",
            "logprobs",  # top logprobs for the near-tie margin (shadow.top_logprobs)
        ]
        assert cand.status is Status.OK and "guided_choice" not in cand.request
        assert cand.ttft_s is not None and cand.completion_tokens == 6
        assert cand.output_text == inc.output_text  # greedy, same model: an A/A pair
    else:
        assert cand.status is Status.HTTP_ERROR and cand.http_status == 400
        assert cand.error and "guided_choice" in cand.error


def test_the_client_path_never_awaits_the_shadow() -> None:
    """The exchange core fires shadow requests (Shadows.fire) and awaits nothing; the client
    server imports nothing of mirror.shadow and awaits nothing named shadow (it cancels the
    pair's shadow tasks when the client leaves); the assembled mirror awaits the shadow only in
    ``shutdown`` (the drain): the promise is a file boundary, and this keeps it one."""
    import ast
    import inspect

    import mirror.app
    import mirror.exchange
    import mirror.server

    def waits_on_shadow(awaited: ast.expr) -> bool:
        """The awaited callable or a positional argument (a gather, a wait) is shadow's."""
        parts = [awaited.func, *awaited.args] if isinstance(awaited, ast.Call) else [awaited]
        return any("shadow" in ast.unparse(p).lower() for p in parts)

    def shadow_awaits(module: object, allowed: str = "") -> list[str]:
        tree = ast.parse(inspect.getsource(module))  # type: ignore[arg-type]
        return [
            f"{fn.name}: {ast.unparse(node)}"
            for fn in ast.walk(tree)
            if isinstance(fn, ast.AsyncFunctionDef) and fn.name != allowed
            for node in ast.walk(fn)
            if isinstance(node, ast.Await) and waits_on_shadow(node.value)
        ]

    def imported(module: object) -> list[str]:
        tree = ast.parse(inspect.getsource(module))  # type: ignore[arg-type]
        return [
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == "mirror.shadow"
            for alias in node.names
        ]

    exchange = ast.parse(inspect.getsource(mirror.exchange))
    assert not [n for n in ast.walk(exchange) if isinstance(n, ast.Await)]
    assert imported(mirror.exchange) == ["Shadows"]
    assert imported(mirror.server) == []
    assert shadow_awaits(mirror.server) == []
    assert shadow_awaits(mirror.app, allowed="shutdown") == []
    assert shadow_awaits(mirror.app) != []  # the drain is seen: the check can fail


def test_replay_sent_apart_and_shadows_asked_for_logprobs(
    engines: tuple[RunningSim, RunningSim],
) -> None:
    """A replay waits ``replay_delay_s`` and uses its own pool (so it is not batched with the
    request it repeats), and says so in its rewrites; the candidate and the replay are asked for
    top logprobs, the client's request never is."""
    s = settings(
        engines,
        shadow={"replay_rate": 1.0, "replay_delay_s": 0.3},
    )
    sink = ListSink()
    mirror = Mirror(s, sink=sink)
    seen_pools: dict[Role, Any] = {}
    start = mirror.shadows.start

    def start_and_look() -> None:
        start()
        seen_pools.update(mirror.shadows.pools)

    mirror.shadows.start = start_and_look  # type: ignore[method-assign]
    responses = asyncio.run(drive(mirror, [(chat(i), {}) for i in range(3)], concurrent=False))
    assert all(r.status_code == 200 for r in responses)
    assert "logprobs" not in responses[0].json()["choices"][0] or (
        responses[0].json()["choices"][0]["logprobs"] is None
    )
    assert seen_pools[Role.REPLAY] is not seen_pools[Role.CANDIDATE]  # its own pool
    assert (
        seen_pools[Role.REPLAY].host_header == mirror.settings.incumbent.url.split("//")[1].encode()
    )
    records = [r for r in sink.records if isinstance(r, ExchangeRecord)]
    by = {(str(r.pair_id), r.role): r for r in records}
    for resp in responses:
        pid = resp.headers["x-shadow-pair-id"]
        inc, cand, rep = (by[(pid, role)] for role in (Role.INCUMBENT, Role.CANDIDATE, Role.REPLAY))
        assert (rep.sent_at - inc.sent_at).total_seconds() >= 0.3
        assert rep.rewrites == [
            "logprobs",
            "cache_salt",
            "replay_delay:0.3",
            "replay_pool:separate",
        ]
        assert "logprobs" in cand.rewrites and "logprobs" not in inc.rewrites
        assert inc.logprobs is None and "logprobs" not in inc.request
        assert cand.logprobs and rep.logprobs and len(cand.logprobs[0].top) >= 5
        assert rep.request["top_logprobs"] == 5 and rep.output_text == inc.output_text
