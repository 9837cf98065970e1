"""Load parity (``shadow.load_parity``): the candidate's requests in flight stay within a ratio of
the incumbent's at dispatch, so a slower candidate cannot pile up requests the incumbent never
had at once; every request it turns away is counted (``skipped_load_parity``) and its records
say so (``guard.decision``). Against a quick incumbent simulator and a candidate ten times
slower, in-process, records in a list sink."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from mirror_helpers import FAST, MODEL, ListSink, decisions, served_in_process

from mirror import sampling
from mirror.app import Mirror
from mirror.config import MirrorSettings, load_settings
from mirror.errors import MirrorConfigError
from mirror.sampling import ShadowConfig
from shadow_ab.dev.processes import RunningSim, running_sim
from shadow_ab.records import ExchangeRecord, Role

SLOW = {
    "latency": {"decode_ms": 20.0, "prefill_base_ms": 20.0, "prefill_per_token_ms": 0.0},
    "answers": {"min_tokens": 8, "max_tokens": 24},
}
"""Ten times the incumbent's decode and prefill time (FAST is 2 ms each)."""


@pytest.fixture(scope="module")
def slow_pair() -> Iterator[tuple[RunningSim, RunningSim]]:
    with (
        running_sim("vllm", "clean", overrides=FAST, ledger=False) as inc,
        running_sim("vllm", "clean", overrides=SLOW, ledger=False) as cand,
    ):
        yield inc, cand


def settings(pair: tuple[RunningSim, RunningSim], **shadow: Any) -> MirrorSettings:
    inc, cand = pair
    return load_settings(
        None,
        incumbent={"url": inc.base_url},
        candidate={"url": cand.base_url, "flavor": "vllm"},
        health_enabled=False,
        database_url="sqlite:///unused.db",
        guard={"enabled": False},
        shadow={"rate": 1.0, **shadow},
    )


async def closed_loop(mirror: Mirror, workers: int, each: int) -> list[int]:
    """``workers`` clients, each sending ``each`` streamed greedy chats one after the other."""
    async with served_in_process(mirror) as client:

        async def worker(w: int) -> list[int]:
            codes = []
            for i in range(each):
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"worker {w} question {i}"}],
                    "max_tokens": 12,
                    "temperature": 0,
                    "stream": True,
                }
                resp = await client.post("/v1/chat/completions", json=body)
                codes.append(resp.status_code)
            return codes

        results = await asyncio.gather(*(worker(w) for w in range(workers)))
        return [c for codes in results for c in codes]


def run(pair: tuple[RunningSim, RunningSim], workers: int, **shadow: Any) -> list[ExchangeRecord]:
    sink = ListSink()
    codes = asyncio.run(closed_loop(Mirror(settings(pair, **shadow), sink=sink), workers, 10))
    assert codes == [200] * (workers * 10)
    return [r for r in sink.records if isinstance(r, ExchangeRecord)]


def test_without_parity_the_slow_candidate_piles_up(
    slow_pair: tuple[RunningSim, RunningSim],
) -> None:
    """What load parity is for: unbounded, the candidate holds more requests than the incumbent
    at many dispatches."""
    records = run(slow_pair, workers=3)
    cands = [r for r in records if r.role is Role.CANDIDATE]
    assert len(cands) == 30  # every request shadowed
    ahead = [r for r in cands if (r.inflight_candidate or 0) > (r.inflight_incumbent or 0)]
    assert len(ahead) >= 5
    assert max(r.inflight_candidate or 0 for r in cands) >= 4


@pytest.mark.parametrize(("ratio", "slack", "workers"), [(1.0, 0, 3), (0.5, 1, 4), (2.0, 0, 2)])
def test_parity_bounds_the_candidate_and_counts_what_it_skips(
    slow_pair: tuple[RunningSim, RunningSim],
    ratio: float,
    slack: int,
    workers: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sampling, "LOAD_PARITY_SLACK", slack)  # a constant since issue 26
    before = decisions()
    records = run(slow_pair, workers, load_parity=ratio)
    after = decisions()
    counted = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}

    by_role = Counter(r.role for r in records)
    incs = [r for r in records if r.role is Role.INCUMBENT]
    cands = [r for r in records if r.role is Role.CANDIDATE]
    assert by_role[Role.INCUMBENT] == workers * 10
    # Both engines' in-flight counts are recorded at dispatch, for both roles.
    assert all(
        r.inflight_incumbent is not None and r.inflight_candidate is not None for r in records
    )
    # The bound, at every dispatch that was shadowed (this request on both sides).
    for r in cands:
        assert r.inflight_candidate is not None and r.inflight_incumbent is not None
        assert r.inflight_candidate + 1 <= ratio * (r.inflight_incumbent + 1) + slack
    # Skipped, counted and recorded: the metric, the incumbent records and the candidate
    # records agree.
    recorded = Counter(r.guard["decision"] for r in incs)
    assert set(recorded) <= {"sampled", "skipped_load_parity"}
    assert recorded["sampled"] == len(cands) == counted["sampled"]
    assert recorded["skipped_load_parity"] == counted["skipped_load_parity"] > 0
    assert {r.guard["decision"] for r in cands} == {"sampled"}


def test_the_bound_itself() -> None:
    one = ShadowConfig(load_parity=1.0)
    assert one.parity_allows(0, 0) and one.parity_allows(2, 2)
    assert not one.parity_allows(1, 0) and not one.parity_allows(3, 2)
    half = ShadowConfig(load_parity=0.5)
    assert half.parity_allows(1, 1, slack=1) and not half.parity_allows(2, 1, slack=1)
    assert half.parity_allows(2, 3, slack=1) and not half.parity_allows(3, 3, slack=1)
    assert ShadowConfig().parity_allows(1000, 0)  # off by default


def test_bad_load_parity_is_refused_with_the_setting_named() -> None:
    for bad in (0, -1.0):
        with pytest.raises(MirrorConfigError, match=r"shadow\.load_parity"):
            load_settings(
                None,
                incumbent={"url": "http://127.0.0.1:1"},
                candidate={"url": "http://127.0.0.1:2"},
                shadow={"load_parity": bad},
            )
