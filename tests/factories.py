"""Builders of exchange records and health samples, for every test folder.

- ``exchange`` / ``health``: a valid record with only the required fields (an ok streamed chat
  answer of the incumbent at ``T0`` with a pair id of its own; an engine that is up) and the
  fields the test names. What a test does not name stays empty, so an analysis sees only what
  the test put there.
- ``numbered_exchange`` / ``numbered_health``: the ``i``-th record of a deployment, a plausible
  answer (or scrape) with timings and token counts, its own pair, ``i`` ms (or s) after ``T0``:
  for tests that move many records (sinks, Kafka, the ingester) and count them at the end.
- ``full_exchange`` / ``full_health``, ``exchanges``, ``health_series``: every field filled in,
  seeded: the builders the benchmarks use (:mod:`shadow_ab.dev.synthetic`).
- ``exchange_document``: the JSON object a producer sends, not validated, to break on purpose.

Folder-specific data (a month of paired latencies, a seeded API store, incident scenarios) is
built in its folder, through these.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import orjson

from shadow_ab.dev.synthetic import T0, engine_of, exchanges, health_series, text_of
from shadow_ab.dev.synthetic import exchange as full_exchange
from shadow_ab.dev.synthetic import health as full_health
from shadow_ab.records import ExchangeRecord, HealthSample, Record

__all__ = [
    "T0",
    "engine_of",
    "exchange",
    "exchange_document",
    "exchanges",
    "full_exchange",
    "full_health",
    "health",
    "health_series",
    "numbered_exchange",
    "numbered_health",
    "text_of",
]


def exchange(**fields: Any) -> ExchangeRecord:
    """An ok exchange with the required fields only, and ``fields`` (the engine follows the
    role unless given)."""
    role = fields.get("role", "incumbent")
    base: dict[str, Any] = {
        "deployment": "dep-a",
        "pair_id": uuid.uuid4(),
        "role": role,
        "engine": engine_of(role),
        "endpoint": "chat",
        "stream": True,
        "sent_at": T0,
        "status": "ok",
    }
    return ExchangeRecord.model_validate({**base, **fields})


def health(**fields: Any) -> HealthSample:
    """A scrape of an engine that is up, with the required fields only, and ``fields`` (the
    engine follows the role unless given)."""
    role = fields.get("role", "incumbent")
    base: dict[str, Any] = {
        "deployment": "dep-a",
        "engine": engine_of(role),
        "role": role,
        "ts": T0,
        "up": True,
    }
    return HealthSample.model_validate({**base, **fields})


def numbered_exchange(
    deployment: str, i: int, role: str = "incumbent", **fields: Any
) -> ExchangeRecord:
    """The ``i``-th exchange of ``deployment``: its own pair (the same id for the same ``i``),
    sent ``i`` ms after ``T0``, answer ``"answer {i}"``."""
    return exchange(
        **{
            "deployment": deployment,
            "pair_id": uuid.uuid5(uuid.NAMESPACE_URL, f"{deployment}/{i}"),
            "role": role,
            "model": "llama-3-8b",
            "sent_at": T0 + timedelta(milliseconds=i),
            "http_status": 200,
            "ttft_s": 0.04,
            "e2e_s": 0.2,
            "tpot_s": 0.008,
            "itl_s": [0.008] * 5,
            "prompt_tokens": 12,
            "completion_tokens": 6,
            "finish_reason": "stop",
            "request": {
                "messages": [{"role": "user", "content": f"question {i}"}],
                "max_tokens": 6,
            },
            "output_text": f"answer {i}",
            **fields,
        }
    )


def numbered_health(
    deployment: str, i: int, role: str = "incumbent", **fields: Any
) -> HealthSample:
    """The ``i``-th scrape of ``deployment``'s engine of ``role``, ``i`` s after ``T0``."""
    engine = engine_of(role)
    return health(
        **{
            "deployment": deployment,
            "engine": engine,
            "role": role,
            "flavor": engine.partition("@")[0],
            "ts": T0 + timedelta(seconds=i),
            "http_status": 200,
            "latency_s": 0.002,
            "num_running": 3,
            "num_waiting": 0,
            **fields,
        }
    )


def exchange_document(**overrides: Any) -> dict[str, Any]:
    """``full_exchange()`` as the JSON object on the wire, with ``overrides`` put in as they are
    (not validated: a test may put in what the contract refuses)."""
    document: dict[str, Any] = orjson.loads(full_exchange().to_json())
    document.update(overrides)
    return document


class ListSink:
    """A record sink (the mirror's RecordSink seam) that keeps what it is given."""

    label = "direct"

    def __init__(self) -> None:
        self.records: list[Record] = []

    def submit(self, record: Record) -> bool:
        self.records.append(record)
        return True

    def flush(self, timeout: float = 30.0) -> bool:
        return True

    def close(self, timeout: float = 30.0) -> bool:
        return True
