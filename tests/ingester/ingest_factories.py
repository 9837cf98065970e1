"""Records and raw messages for the ingester's tests."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from shadow_ab.records import (
    Endpoint,
    ExchangeRecord,
    HealthSample,
    Role,
    Status,
)

BASE_TIME = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)


def exchange(deployment: str, i: int, role: Role = Role.INCUMBENT) -> ExchangeRecord:
    return ExchangeRecord(
        deployment=deployment,
        pair_id=uuid.uuid5(uuid.NAMESPACE_URL, f"{deployment}/{i}"),
        role=role,
        engine="vllm@incumbent" if role is not Role.CANDIDATE else "trtllm@candidate",
        endpoint=Endpoint.CHAT,
        stream=True,
        model="llama-3-8b",
        sent_at=BASE_TIME + timedelta(milliseconds=i),
        status=Status.OK,
        http_status=200,
        ttft_s=0.04,
        e2e_s=0.2,
        tpot_s=0.008,
        itl_s=[0.008] * 5,
        prompt_tokens=12,
        completion_tokens=6,
        finish_reason="stop",
        request={"messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 6},
        output_text=f"answer {i}",
    )


def health(deployment: str, i: int) -> HealthSample:
    return HealthSample(
        deployment=deployment,
        engine="vllm@incumbent",
        role=Role.INCUMBENT,
        flavor="vllm",
        ts=BASE_TIME + timedelta(seconds=i),
        up=True,
        http_status=200,
        latency_s=0.002,
        num_running=3,
        num_waiting=0,
    )


@dataclass
class Msg:
    """A message as the consumer hands it over (same attributes as kafka's ConsumerRecord)."""

    topic: str
    partition: int
    offset: int
    value: bytes | None
    key: bytes | None = None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
