"""The seeded store the API tests read: deployments, pairs, incidents and reports with known
values, and the expectations derived from the same rules (not from the API)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from factories import exchange
from sqlalchemy import Engine, insert, update

from shadow_ab.records import ExchangeRecord
from storage.models import Deployment, Incident, Report
from storage.write import write_exchanges

DEP = "dep-a"
EMPTY_DEP = "dep-empty"
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
N_PAIRS = 30
PROMPT = [{"role": "user", "content": "What is six times seven?"}]
READ_TOKEN = "read-token-0123456789"
CONTENT_TOKEN = "content-token-0123456789"
ONLY_CONTENT_TOKEN = "only-content-token-0123"
TOKENS = {
    READ_TOKEN: ["read"],
    CONTENT_TOKEN: ["read", "content"],
    ONLY_CONTENT_TOKEN: ["content"],
}
SIDE_BY_SIDE_PAIR = uuid.UUID(int=7_000)
INCUMBENT_TEXT = "The answer is 42. Six times seven."
CANDIDATE_TEXT = "The answer is 43. Six times seven."
REPLAY_TEXT = "The answer is 42, six times seven."


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def pair_id(i: int) -> uuid.UUID:
    # Ids not in sent_at order, so the (sent_at, pair_id) tie-break is exercised.
    return uuid.UUID(int=(i * 7919) % 1000 + 1)


def sent_at(i: int) -> datetime:
    # Two pairs per instant: keyset pages must break ties by pair_id.
    return T0 + timedelta(hours=2 * (i // 2))


def candidate_differs(i: int) -> bool:
    return i % 3 == 0


def finish_differs(i: int) -> bool:
    return i % 5 == 0


def replay_differs(i: int) -> bool:
    return i % 7 == 0


def _exchange(i: int, role: str, text: str, finish: str) -> ExchangeRecord:
    return exchange(
        deployment=DEP,
        pair_id=pair_id(i),
        role=role,
        model="llama-3-8b",
        sent_at=sent_at(i),
        http_status=200,
        ttft_s=0.040 + i / 1000,
        e2e_s=0.200 + i / 1000,
        tpot_s=0.008,
        itl_s=[0.008, 0.009],
        prompt_tokens=12,
        completion_tokens=len(text.split()),
        finish_reason=finish,
        request={"messages": PROMPT, "temperature": 0, "max_tokens": 64, "seed": i},
        rewrites=["model=llama-3-8b-trt"] if role == "candidate" else [],
        output_text=text,
    )


def exchanges() -> list[ExchangeRecord]:
    records = []
    for i in range(N_PAIRS):
        base = f"pair {i}: the quick brown fox"
        records.append(_exchange(i, "incumbent", base, "stop"))
        records.append(
            _exchange(
                i,
                "candidate",
                base + (" jumps" if candidate_differs(i) else ""),
                "length" if finish_differs(i) else "stop",
            )
        )
        if i % 2 == 0:
            records.append(
                _exchange(i, "replay", base + (" leaps" if replay_differs(i) else ""), "stop")
            )
    # The side-by-side pair, after all the others, with logprobs at the divergence.
    when = sent_at(N_PAIRS) + timedelta(hours=1)
    lp_inc = [{"token": "42", "logprob": -0.1, "top": {"42": -0.1, "43": -0.2}}]
    lp_cand = [{"token": "43", "logprob": -0.1, "top": {"43": -0.1, "42": -0.3}}]
    for role, text, lps in (
        ("incumbent", INCUMBENT_TEXT, lp_inc),
        ("candidate", CANDIDATE_TEXT, lp_cand),
        ("replay", REPLAY_TEXT, None),
    ):
        records.append(
            exchange(
                deployment=DEP,
                pair_id=SIDE_BY_SIDE_PAIR,
                role=role,
                model="llama-3-8b",
                sent_at=when,
                ttft_s=0.05,
                e2e_s=0.3,
                itl_s=[0.01],
                finish_reason="stop",
                request={"messages": PROMPT, "temperature": 0, "max_tokens": 64},
                rewrites=["drop:logit_bias"] if role == "candidate" else [],
                output_text=text,
                logprobs=lps,
            )
        )
    return records


def expected_divergent(against: str = "candidate") -> list[uuid.UUID]:
    """Pair ids whose ``against`` output or finish reason differs, in keyset order."""
    if against == "candidate":
        ids = [
            (sent_at(i), pair_id(i))
            for i in range(N_PAIRS)
            if candidate_differs(i) or finish_differs(i)
        ]
    else:
        ids = [(sent_at(i), pair_id(i)) for i in range(0, N_PAIRS, 2) if replay_differs(i)]
    ids.append((sent_at(N_PAIRS) + timedelta(hours=1), SIDE_BY_SIDE_PAIR))
    return [p for _, p in sorted(ids)]


INCIDENTS = [
    ("vllm@incumbent", "crash", T0 + timedelta(hours=3)),
    ("trtllm@candidate", "crash", T0 + timedelta(hours=5)),
    ("trtllm@candidate", "crash", T0 + timedelta(days=1, hours=2)),
    ("trtllm@candidate", "leak", T0 + timedelta(days=2)),
    ("trtllm@candidate", "hang", T0 + timedelta(days=9)),
]

REPORT_BODY = {
    "verdict": "NO-GO",
    "divergence": {
        "worst": [
            {"pair_id": str(SIDE_BY_SIDE_PAIR), "candidate_output": CANDIDATE_TEXT, "score": 0.9}
        ]
    },
    "latency": {"ttft": {"p50": {"ratio": 1.1}}},
}


def seed(engine: Engine) -> None:
    write_exchanges(engine, exchanges())
    with engine.begin() as conn:
        conn.execute(
            update(Deployment)
            .where(Deployment.name == DEP)
            .values(
                incumbent_engine="vllm",
                incumbent_version="0.11.0",
                candidate_engine="trtllm",
                candidate_version="1.0.0",
                model="llama-3-8b",
                hardware="1xH100",
                started_at=T0,
                policy={"criteria": []},
            )
        )
        conn.execute(insert(Deployment).values(name=EMPTY_DEP))
        conn.execute(
            insert(Incident),
            [
                {
                    "deployment": DEP,
                    "engine": eng,
                    "kind": kind,
                    "started_at": start,
                    "ended_at": start + timedelta(minutes=5),
                    "evidence": {"role": eng.split("@")[1], "note": f"{kind} of {eng}"},
                }
                for eng, kind, start in INCIDENTS
            ],
        )
        conn.execute(
            insert(Report),
            [
                {
                    "deployment": DEP,
                    "created_at": T0 + timedelta(days=3),
                    "window_from": T0,
                    "window_to": T0 + timedelta(days=3),
                    "verdict": "INCONCLUSIVE",
                    "body": {"verdict": "INCONCLUSIVE", "latency": {}},
                    "html": None,
                },
                {
                    "deployment": DEP,
                    "created_at": T0 + timedelta(days=7),
                    "window_from": T0,
                    "window_to": T0 + timedelta(days=7),
                    "verdict": "NO-GO",
                    "body": REPORT_BODY,
                    "html": "<html><body><h1>NO-GO</h1></body></html>",
                },
            ],
        )
