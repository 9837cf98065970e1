"""Engine-aware asks (issue 29): the top-logprobs ask the mirror adds to the candidate's copy
is never sent where the engine refuses it, and a refusal of it never counts against the
candidate (mirror/asks.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from mirror_helpers import FAST, MODEL, ListSink, served_in_process
from prometheus_client import REGISTRY

from evaluator.incidents.model import FAILED_STATUSES
from mirror.app import Mirror
from mirror.asks import Asks
from mirror.config import MirrorSettings, load_settings
from shadow_ab.dev.processes import RunningSim, running_sim
from shadow_ab.records import ExchangeRecord, Role, Status

ROUTE = "/v1/completions"


@pytest.fixture(scope="module")
def strict_trt() -> Iterator[tuple[RunningSim, RunningSim]]:
    """A vLLM incumbent and a TensorRT-LLM candidate that refuses completions logprobs, as
    1.2.0rc2 does (400 "logprobs is not supported")."""
    with (
        running_sim("vllm", "clean", overrides=FAST, ledger=False) as inc,
        running_sim(
            "trtllm", "clean", overrides={**FAST, "completion_logprobs": False}, ledger=False
        ) as cand,
    ):
        yield inc, cand


def settings(sims: tuple[RunningSim, RunningSim], flavor: str) -> MirrorSettings:
    inc, cand = sims
    return load_settings(
        None,
        incumbent={"url": inc.base_url},
        candidate={"url": cand.base_url, "flavor": flavor},
        health_enabled=False,
        database_url="sqlite:///unused.db",
        guard={"enabled": False},
        shadow={"rate": 1.0, "replay_rate": 0.0},
    )


def body(i: int, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": f"count to {i}", "max_tokens": 8, "temperature": 0, **extra}


async def traffic(mirror: Mirror, bodies: list[dict[str, Any]]) -> None:
    async with served_in_process(mirror) as client:
        for b in bodies:  # one at a time: the first refusal is learnt before the next request
            resp = await client.post(ROUTE, json=b)
            assert resp.status_code == 200
            await asyncio.sleep(0.3)


def candidates(sink: ListSink) -> list[ExchangeRecord]:
    recs = [r for r in sink.records if isinstance(r, ExchangeRecord) and r.role is Role.CANDIDATE]
    return sorted(recs, key=lambda r: r.sent_at)


def dropped(route: str) -> float:
    labels = {"route": route, "ask": "logprobs"}
    return REGISTRY.get_sample_value("shadow_ab_mirror_asks_dropped_total", labels) or 0.0


def test_a_refused_ask_is_dropped_and_not_the_candidates_failure(
    strict_trt: tuple[RunningSim, RunningSim], caplog: pytest.LogCaptureFixture
) -> None:
    sink = ListSink()
    before = dropped(ROUTE)
    with caplog.at_level(logging.WARNING, logger="mirror.asks"):
        asyncio.run(
            traffic(Mirror(settings(strict_trt, "auto"), sink=sink), [body(i) for i in range(4)])
        )
    recs = candidates(sink)
    assert len(recs) == 4
    first, rest = recs[0], recs[1:]
    # The first carried the ask and was refused: kept as the engine answered, marked, and not
    # a failure for the evaluator's failure counts.
    assert first.request.get("logprobs") == 5
    assert first.http_status == 400 and "logprobs is not supported" in (first.error or "")
    assert "refused:logprobs" in first.rewrites
    assert first.status is Status.CANCELLED
    assert str(first.status) not in FAILED_STATUSES
    # Then the ask is no longer added on that route, and the candidate answers.
    assert all("logprobs" not in r.request and "logprobs" not in r.rewrites for r in rest)
    assert all(r.status is Status.OK for r in rest)
    assert dropped(ROUTE) == before + 1
    warnings = [r for r in caplog.records if r.name == "mirror.asks"]
    assert len(warnings) == 1
    assert ROUTE in warnings[0].getMessage()
    assert "logprobs is not supported" in warnings[0].getMessage()


def test_a_trtllm_candidate_never_gets_the_completions_ask(
    strict_trt: tuple[RunningSim, RunningSim],
) -> None:
    sink = ListSink()
    asyncio.run(traffic(Mirror(settings(strict_trt, "trtllm"), sink=sink), [body(1), body(2)]))
    recs = candidates(sink)
    assert len(recs) == 2
    assert all(r.status is Status.OK for r in recs)
    assert all("logprobs" not in r.request and "logprobs" not in r.rewrites for r in recs)


def test_the_clients_own_asks_are_left_alone() -> None:
    asks = Asks("trtllm")
    # chat keeps the ask on TensorRT-LLM; completions do not
    assert asks.top_logprobs("/v1/chat/completions", chat=True, k=5) == 5
    assert asks.top_logprobs(ROUTE, chat=False, k=5) is None
    assert Asks("auto").top_logprobs(ROUTE, chat=False, k=5) == 5
    # n > 1 is the client's: noted, not changed
    assert asks.notes({"n": 2}) == ["unsupported:n"]
    assert asks.notes({"n": 1}) == [] and Asks("auto").notes({"n": 2}) == []
    # a 400 that does not name the ask is the candidate's own failure
    auto = Asks("auto")
    assert not auto.refused(ROUTE, "logprobs", 400, '{"message": "suffix is not supported"}')
    assert not auto.refused(ROUTE, "logprobs", 500, "logprobs is not supported")
    assert auto.top_logprobs(ROUTE, chat=False, k=5) == 5
    assert auto.refused(ROUTE, "logprobs", 400, "logprobs is not supported")
    assert auto.top_logprobs(ROUTE, chat=False, k=5) is None
    assert auto.top_logprobs("/v1/chat/completions", chat=True, k=5) == 5
