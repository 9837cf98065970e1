"""The whole path on real engines: a real numerical migration, from vLLM in bfloat16 (the
incumbent) to the same weights in float32 (the candidate), each engine on its own CPU, the
mirror in front (every request shadowed and replayed), greedy traffic, records in the store,
then ``shadow-ab report``. Its divergence figures must be what a direct comparison of the two
servers' answers to the same prompts says: the candidate's rate is the share of prompts where
bf16 and fp32 answer differently, the noise rate the share where bf16 differs from itself.

Greedy decoding on one real vLLM is deterministic (the same answer twice, sequential or
concurrent, streamed or not), so the figures must agree exactly, not within a margin.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy import text

from evaluator.report_cli import report
from shadow_ab.dev.engines.vllm_cpu import RunningVllm
from shadow_ab.dev.processes import running_mirror
from storage.db import make_engine

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(1800)]

DEPLOYMENT = "whole-path-bf16-fp32"
N = 50
CONCURRENCY = 4
_SUBJECTS = (
    "the river", "a bridge", "the market", "winter", "the server", "a garden", "the tower",
    "an island", "the budget", "a signal",
)  # fmt: skip
_ASKS = ("Tell me about", "Explain", "Describe", "Write a note on", "Compare the parts of")


def bodies() -> list[dict[str, Any]]:
    """``N`` greedy requests: chat and completions, streamed and not, 24 tokens each."""
    out: list[dict[str, Any]] = []
    for i in range(N):
        subject = _SUBJECTS[i % len(_SUBJECTS)]
        ask = _ASKS[(i // len(_SUBJECTS)) % len(_ASKS)]
        common = {"model": "tiny-llama", "max_tokens": 24, "temperature": 0, "stream": i % 3 == 0}
        if i % 2 == 0:
            out.append({**common, "messages": [{"role": "user", "content": f"{ask} {subject}"}]})
        else:
            out.append({**common, "prompt": f"{ask} {subject} and"})
    return out


def path(body: dict[str, Any]) -> str:
    return "/v1/chat/completions" if "messages" in body else "/v1/completions"


def answer_text(raw: dict[str, Any]) -> str:
    choice = raw["choices"][0]
    return str(choice["message"]["content"] if "message" in choice else choice["text"])


async def ask_all(base_url: str, requests: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """POST every request (``CONCURRENCY`` at a time); per request the text of a non-streamed
    answer (empty for a stream, read to its end) and the ``x-shadow-pair-id`` header, if any."""
    gate = asyncio.Semaphore(CONCURRENCY)
    async with httpx.AsyncClient(base_url=base_url, timeout=300.0) as client:

        async def one(body: dict[str, Any]) -> tuple[str, str]:
            async with gate:
                resp = await client.post(path(body), json=body)
            assert resp.status_code == 200, resp.text[:500]
            pair = resp.headers.get("x-shadow-pair-id", "")
            return ("" if body["stream"] else answer_text(resp.json())), pair

        return list(await asyncio.gather(*(one(b) for b in requests)))


def direct_texts(engine: RunningVllm, requests: list[dict[str, Any]]) -> list[str]:
    unstreamed = [{**b, "stream": False} for b in requests]
    return [t for t, _ in asyncio.run(ask_all(engine.base_url, unstreamed))]


@pytest.fixture(scope="module")
def direct(vllm_bf16: RunningVllm, vllm_fp32: RunningVllm) -> dict[str, list[str]]:
    """The two servers asked directly (not through the mirror), bf16 twice."""
    requests = bodies()
    return {
        "bf16": direct_texts(vllm_bf16, requests),
        "fp32": direct_texts(vllm_fp32, requests),
        "bf16-again": direct_texts(vllm_bf16, requests),
    }


@pytest.fixture(scope="module")
def mirrored(
    vllm_bf16: RunningVllm, vllm_fp32: RunningVllm, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, list[str]]]:
    """The same requests through the mirror (all shadowed and replayed); the store's URL and
    each request's pair id."""
    url = f"sqlite:///{tmp_path_factory.mktemp('whole-path') / 'records.db'}"
    with running_mirror(
        vllm_bf16.base_url,
        vllm_fp32.base_url,
        database_url=url,
        deployment=DEPLOYMENT,
        shadow={"rate": 1.0, "replay_rate": 1.0},
        guard={"enabled": False},  # every request shadowed: the comparison covers all prompts
        incumbent={"flavor": "vllm", "engine": "vllm-bf16@incumbent"},
        candidate={"flavor": "vllm", "engine": "vllm-fp32@candidate"},
        health={"interval_s": 1.0},
    ) as mirror:
        pairs = [pair for _, pair in asyncio.run(ask_all(mirror.base_url, bodies()))]
        mirror.stop()  # shadow requests drained, records flushed
    yield url, pairs


def stored(url: str) -> dict[tuple[str, str], dict[str, Any]]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT * FROM exchanges WHERE deployment = :d"), {"d": DEPLOYMENT}
            ).all()
    finally:
        engine.dispose()
    return {(str(r.pair_id).replace("-", ""), r.role): dict(r._mapping) for r in rows}


def test_the_two_servers_differ_as_a_numerical_migration_does(
    direct: dict[str, list[str]],
) -> None:
    """The ground truth the report is checked against means something: bf16 and fp32 differ on
    some prompts, not all; bf16 asked twice does not differ."""
    differ = sum(a != b for a, b in zip(direct["bf16"], direct["fp32"], strict=True))
    assert 0 < differ < N
    assert direct["bf16"] == direct["bf16-again"]
    assert all(direct["bf16"]) and all(direct["fp32"])


def test_the_records_hold_what_each_server_answers(
    direct: dict[str, list[str]], mirrored: tuple[str, list[str]]
) -> None:
    url, pairs = mirrored
    rows = stored(url)
    assert len(pairs) == N and len(set(pairs)) == N
    for i, pair in enumerate(pairs):
        key = pair.replace("-", "")
        inc, cand, replay = (rows[(key, role)] for role in ("incumbent", "candidate", "replay"))
        for row in (inc, cand, replay):
            assert row["status"] == "ok", row["error"]
            # both engines' in-flight counts at dispatch, on every role's record
            assert row["inflight_incumbent"] is not None and row["inflight_candidate"] is not None
        assert inc["engine"] == "vllm-bf16@incumbent" and cand["engine"] == "vllm-fp32@candidate"
        assert inc["output_text"] == direct["bf16"][i], f"prompt {i}"
        assert replay["output_text"] == direct["bf16"][i], f"prompt {i}"
        assert cand["output_text"] == direct["fp32"][i], f"prompt {i}"


def test_the_reports_divergence_is_the_direct_comparisons(
    direct: dict[str, list[str]], mirrored: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, _ = mirrored
    out = tmp_path / "review.json"
    result = CliRunner().invoke(
        report,
        ["-d", DEPLOYMENT, "--database-url", url, "--format", "json", "-o", str(out)],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    review = json.loads(out.read_text())
    figures = {m["key"]: m for m in review["measurements"]}
    section = review["sections"]["divergence"]

    differ = sum(a != b for a, b in zip(direct["bf16"], direct["fp32"], strict=True))
    noise = sum(a != b for a, b in zip(direct["bf16"], direct["bf16-again"], strict=True))
    assert (section["candidate"]["greedy"], section["candidate"]["diverged"]) == (N, differ)
    assert (section["replay"]["greedy"], section["replay"]["diverged"]) == (N, noise)
    assert figures["divergence.candidate_rate"]["value"] == pytest.approx(differ / N)
    assert figures["divergence.noise_rate"]["value"] == pytest.approx(noise / N)
    assert figures["divergence.excess_rate"]["value"] == pytest.approx((differ - noise) / N)
    assert figures["data.pairs"]["value"] == N
