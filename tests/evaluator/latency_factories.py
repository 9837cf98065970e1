"""Month-shaped paired exchange records for the latency tests (no tests here), built through
tests/factories.py."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import numpy as np
from factories import exchange

from shadow_ab.records import ExchangeRecord

T0 = datetime(2026, 11, 2, 0, 0, 0, tzinfo=UTC)  # a Monday


def record(
    *,
    pair_id: uuid.UUID,
    role: str,
    sent_at: datetime,
    ttft: float,
    tpot: float,
    tokens: int,
    itl: list[float],
    inflight: int = 3,
    prompt_tokens: int = 200,
    status: str = "ok",
    deployment: str = "dep-lat",
) -> ExchangeRecord:
    ok = status == "ok"
    return exchange(
        deployment=deployment,
        pair_id=pair_id,
        role=role,
        sent_at=sent_at,
        status=status,
        http_status=200 if ok else 500,
        ttft_s=ttft if ok else None,
        e2e_s=ttft + tpot * (tokens - 1) if ok else None,
        tpot_s=tpot if ok and tokens > 1 else None,
        itl_s=itl if ok else [],
        prompt_tokens=prompt_tokens,
        completion_tokens=tokens if ok else None,
        inflight_incumbent=inflight,
        inflight_candidate=inflight,
    )


def pairs(
    n: int,
    *,
    start: datetime = T0,
    step: timedelta = timedelta(seconds=10),
    cand_ttft: float = 1.0,
    cand_tpot: float = 1.0,
    seed: int = 0,
    deployment: str = "dep-lat",
    cand_error_every: int = 0,
) -> list[ExchangeRecord]:
    """``n`` pairs one every ``step``: incumbent TTFT ~ lognormal around 50 ms, TPOT around
    8 ms; the candidate's values are the incumbent's times ``cand_ttft`` / ``cand_tpot`` with
    2 % noise. Every ``cand_error_every``-th candidate fails (0: none)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        pid = uuid.UUID(int=(seed << 64) + i + 1)
        sent = start + step * i
        ttft = float(rng.lognormal(np.log(0.05), 0.4))
        tpot = float(rng.lognormal(np.log(0.008), 0.2))
        tokens = int(rng.integers(2, 300))
        inflight = int(rng.integers(0, 40))
        prompt = int(rng.integers(10, 4000))
        gaps = [float(g) for g in rng.lognormal(np.log(tpot), 0.3, size=min(tokens - 1, 12))]
        out.append(
            record(
                pair_id=pid,
                role="incumbent",
                sent_at=sent,
                ttft=ttft,
                tpot=tpot,
                tokens=tokens,
                itl=gaps,
                inflight=inflight,
                prompt_tokens=prompt,
                deployment=deployment,
            )
        )
        noise = rng.lognormal(0, 0.02, size=3)
        failed = cand_error_every > 0 and i % cand_error_every == 0
        out.append(
            record(
                pair_id=pid,
                role="candidate",
                sent_at=sent + timedelta(milliseconds=1),
                ttft=ttft * cand_ttft * float(noise[0]),
                tpot=tpot * cand_tpot * float(noise[1]),
                tokens=tokens,
                itl=[g * cand_tpot * float(noise[2]) for g in gaps],
                inflight=inflight,
                prompt_tokens=prompt,
                status="http_error" if failed else "ok",
                deployment=deployment,
            )
        )
    return out
