"""The divergence knob: its rates, and the ledger naming exactly the requests that diverged."""

from __future__ import annotations

import asyncio
import collections
import random
import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from sim_helpers import FAST

from shadow_ab.dev.processes import RunningSim, running_pair, running_sim
from simulator.generate import choose_departure
from simulator.ledger import summarize

MODEL = "sim-llama-3-8b-instruct"
N = 300
P = 0.3
NEAR = 0.5


def test_choose_departure_rates_and_positions() -> None:
    rng = random.Random(5)
    draws = [choose_departure(rng, p=P, near_tie_share=NEAR, length=24) for _ in range(20_000)]
    hits = [d for d in draws if d is not None]
    # Binomial sd: sqrt(20000 * .3 * .7) = 65 -> 5 sd = 325.
    assert abs(len(hits) - 6000) <= 325
    near = sum(d.near_tie for d in hits)
    assert abs(near - len(hits) / 2) <= 5 * (len(hits) * 0.25) ** 0.5
    positions = collections.Counter(d.position for d in hits)
    assert set(positions) == set(range(24))
    assert min(positions.values()) > 150  # ~250 each
    windowed = [
        choose_departure(rng, p=1.0, near_tie_share=0.0, length=24, position_min=5, position_max=7)
        for _ in range(300)
    ]
    assert {d.position for d in windowed if d} == {5, 6, 7}
    assert not any(d.near_tie for d in windowed if d)
    assert choose_departure(rng, p=1.0, near_tie_share=1, length=3, position_min=5) is None
    assert choose_departure(rng, p=0.0, near_tie_share=1, length=30) is None


@pytest.fixture(scope="module")
def candidate() -> Iterator[RunningSim]:
    overrides = {**FAST, "divergence": {"p": P, "near_tie_share": NEAR}}
    with running_sim("trtllm", "clean", overrides=overrides) as s:
        yield s


async def _ask_all(sims: list[RunningSim], prompts: list[str], **kw: Any) -> list[list[Any]]:
    clients = [openai.AsyncOpenAI(base_url=s.v1, api_key="x", max_retries=0) for s in sims]
    gate = asyncio.Semaphore(24)

    async def one(c: openai.AsyncOpenAI, prompt: str, pair: str) -> Any:
        async with gate:
            return await c.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": prompt}],
                temperature=0,
                max_tokens=24,
                logprobs=True,
                top_logprobs=5,
                extra_headers={"x-shadow-pair-id": pair},
                **kw,
            )

    pairs = [str(uuid.uuid4()) for _ in prompts]
    try:
        results = await asyncio.gather(
            *(one(c, p, pair) for c in clients for p, pair in zip(prompts, pairs, strict=True))
        )
    finally:
        for c in clients:
            await c.close()
    n = len(prompts)
    return [[pairs[i] for i in range(n)]] + [results[k * n : (k + 1) * n] for k in range(len(sims))]


def _tokens(resp: Any) -> list[Any]:
    return list(resp.choices[0].logprobs.content)


def test_a_a_pair_matches_exactly_across_flavors(vllm_sim: RunningSim, trt_sim: RunningSim) -> None:
    prompts = [f"A/A question number {i}: what is {i} squared?" for i in range(60)]
    _, ref, other = asyncio.run(_ask_all([vllm_sim, trt_sim], prompts))
    for a, b in zip(ref, other, strict=True):
        assert a.choices[0].message.content == b.choices[0].message.content
        assert [(t.token, t.logprob) for t in _tokens(a)] == [
            (t.token, t.logprob) for t in _tokens(b)
        ]
    assert not [e for e in vllm_sim.ledger() + trt_sim.ledger() if e["event"] == "divergence"]


def test_divergence_rates_and_ledger_match(vllm_sim: RunningSim, candidate: RunningSim) -> None:
    prompts = [f"Question {i}: describe the {i}th river you know." for i in range(N)]
    pairs, ref, cand = asyncio.run(_ask_all([vllm_sim, candidate], prompts))
    found: dict[str, tuple[int, bool]] = {}
    for pair, a, b in zip(pairs, ref, cand, strict=True):
        ta, tb = _tokens(a), _tokens(b)
        assert len(ta) == len(tb) == 24
        k = next(
            (i for i, (x, y) in enumerate(zip(ta, tb, strict=True)) if x.token != y.token), None
        )
        if k is None:
            assert a.choices[0].message.content == b.choices[0].message.content
            continue
        a_top = {t.token for t in ta[k].top_logprobs}
        b_top = {t.token for t in tb[k].top_logprobs}
        near_tie = tb[k].token in a_top and ta[k].token in b_top
        if not near_tie:  # a clear departure: neither side's token in the other's top-k
            assert tb[k].token not in a_top and ta[k].token not in b_top
        found[pair] = (k, near_tie)

    ledger = summarize(candidate.ledger()).diverged_pairs()
    assert set(ledger) == set(found)  # exactly the diverged requests, no more, no less
    for pair, (k, near_tie) in found.items():
        entry = ledger[pair]
        assert (entry["position"], entry["near_tie"], entry["visible"]) == (k, near_tie, True)
        assert entry["request_id"].startswith("chatcmpl-")
    rate = len(found) / N
    sd = (P * (1 - P) / N) ** 0.5
    assert abs(rate - P) <= 4.5 * sd, rate
    near_share = sum(nt for _, nt in found.values()) / len(found)
    assert abs(near_share - NEAR) <= 4.5 * (0.25 / len(found)) ** 0.5, near_share
    positions = {k for k, _ in found.values()}
    assert len(positions) >= 12  # spread over the 24 positions


def test_running_pair_starts_both() -> None:
    with running_pair(("vllm", "noisy"), ("trtllm", "drifty"), overrides=FAST) as (inc, cand):
        assert inc.flavor == "vllm" and cand.flavor == "trtllm"
        assert inc.healthy() and cand.healthy() and inc.port != cand.port
        starts = summarize(inc.ledger()).starts + summarize(cand.ledger()).starts
        assert [s["scenario"] for s in starts] == ["noisy", "drifty"]


def test_divergence_applies_to_greedy_only(candidate: RunningSim) -> None:
    before = len([e for e in candidate.ledger() if e["event"] == "divergence"])
    c = openai.OpenAI(base_url=candidate.v1, api_key="x", max_retries=0)
    for i in range(40):
        c.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"sampled {i}"}],
            temperature=0.7,
            max_tokens=8,
        )
    after = len([e for e in candidate.ledger() if e["event"] == "divergence"])
    assert after == before
