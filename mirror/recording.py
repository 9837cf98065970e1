"""Building one :class:`~shadow_ab.records.ExchangeRecord` from what the mirror sent and measured.

:class:`Dispatch` is what was known when a request left the mirror (pair, role, engine, the
body sent, rewrites, load, guard state); :func:`build_record` adds the exchange's end (status,
HTTP status, error, the :class:`~mirror.trace.Outcome`). Pure.

Errors: pydantic's ValidationError from :class:`ExchangeRecord` when a value is out of the
record's bounds (the caller counts it as a dropped record). Values the mirror computes itself
are in bounds by construction; the record is then built without validation.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from mirror.trace import Outcome
from shadow_ab.records import INT32_MAX, Endpoint, ExchangeRecord, Role, Status

ERROR_MAX_CHARS = 2000
ERROR_BODY_KEEP = 64 * 1024
"""Bytes of an engine's error answer kept for the record's ``error``."""
ZERO = timedelta(0)


@dataclass
class Dispatch:
    """One request as it left the mirror for one engine."""

    pair_id: uuid.UUID
    role: Role
    engine: str
    endpoint: Endpoint
    stream: bool
    sent_at: datetime
    request: dict[str, Any]
    """The JSON body sent (as stored: no credentials)."""
    rewrites: list[str] = field(default_factory=list)
    inflight_incumbent: int | None = None
    inflight_candidate: int | None = None
    guard: dict[str, Any] = field(default_factory=dict)
    capture: str = "full"
    """The capture level of this request's records (:mod:`mirror.privacy`)."""
    synthetic: str | None = None
    """``probe`` for the mirror's own probes (:mod:`mirror.probes`), None for a client's."""
    probe_id: str | None = None

    @property
    def model(self) -> str | None:
        m = self.request.get("model")
        return m if isinstance(m, str) else None


def error_text(body: bytes) -> str:
    """An engine's error body as a short text for ``ExchangeRecord.error``."""
    text = body.decode("utf-8", "replace").strip()
    return text[:ERROR_MAX_CHARS]


def status_of(http_status: int) -> Status:
    return Status.OK if http_status < 400 else Status.HTTP_ERROR


def build_record(
    deployment: str,
    d: Dispatch,
    *,
    status: Status,
    outcome: Outcome | None = None,
    http_status: int | None = None,
    error: str | None = None,
) -> ExchangeRecord:
    o = outcome or Outcome()
    fields: dict[str, Any] = dict(
        deployment=deployment,
        pair_id=d.pair_id,
        role=d.role,
        engine=d.engine,
        endpoint=d.endpoint,
        stream=d.stream,
        model=d.model,
        sent_at=d.sent_at,
        status=status,
        http_status=http_status if http_status is not None and 100 <= http_status <= 599 else None,
        error=error[:ERROR_MAX_CHARS] if error else None,
        ttft_s=o.ttft_s,
        e2e_s=o.e2e_s,
        tpot_s=o.tpot_s,
        itl_s=o.itl_s,
        prompt_tokens=o.prompt_tokens,
        completion_tokens=o.completion_tokens,
        finish_reason=o.finish_reason,
        request=d.request,
        rewrites=d.rewrites,
        output_text=o.output_text,
        logprobs=o.logprobs,
        inflight_incumbent=d.inflight_incumbent,
        inflight_candidate=d.inflight_candidate,
        guard=d.guard,
    )
    if d.synthetic is not None:
        fields.update(synthetic=d.synthetic, probe_id=d.probe_id)
    if _trusted(deployment, d):
        # Every value is in the record's bounds by construction (times clamped at 0, counts
        # and HTTP status checked, UTC send time): skip pydantic's validation (tens of µs).
        return ExchangeRecord.model_construct(**fields)
    return ExchangeRecord(**fields)


def _trusted(deployment: str, d: Dispatch) -> bool:
    """What build_record takes from outside its own checks is in the record's bounds."""
    return (
        0 < len(deployment) <= 200
        and 0 < len(d.engine) <= 200
        and d.sent_at.utcoffset() == ZERO
        and (d.inflight_incumbent is None or 0 <= d.inflight_incumbent <= INT32_MAX)
        and (d.inflight_candidate is None or 0 <= d.inflight_candidate <= INT32_MAX)
        and (d.probe_id is None or 0 < len(d.probe_id) <= 200)
    )
