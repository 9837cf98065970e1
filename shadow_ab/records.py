"""The records that flow from the mirror and the health sampler to the store.

One module, imported by every producer (mirror, sampler, simulator-driven tests) and every
consumer (ingester, direct sink, evaluator), so the wire contract lives in one place.

Two record kinds, each a JSON object with a ``schema_version`` and a ``kind``:

- :class:`ExchangeRecord` (topic ``shadow.exchanges``, key = ``pair_id``): one engine's answer
  within a pair; ``role`` is ``incumbent``, ``candidate`` or ``replay``.
- :class:`HealthSample` (topic ``shadow.health``, key = ``engine``): one scrape of one engine.

Errors::

    RecordError                 the payload is not a valid record (never retried: poison)

Timings are seconds measured on the mirror's monotonic clock relative to ``sent_at``; the
wall-clock ``sent_at`` / ``ts`` (UTC) place the record in time and pick its partition.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from shadow_ab.timestamps import aware_utc

SCHEMA_VERSION = 1
"""Bumped on an incompatible change; consumers accept every version up to their own."""

RECORD_TIME_MIN = datetime(1970, 1, 1, tzinfo=UTC)
RECORD_TIME_MAX = datetime(9999, 1, 1, tzinfo=UTC)
"""A record's ``sent_at`` / ``ts`` must lie in ``[RECORD_TIME_MIN, RECORD_TIME_MAX)``: the store
files records in daily partitions and needs the day after a record's day to exist (9999-12-31
has none), so times outside the range are refused when the record is parsed, not by the store."""


class RecordError(ValueError):
    """A payload that is not a valid record. It will never become valid: do not retry it."""


class Role(StrEnum):
    INCUMBENT = "incumbent"
    CANDIDATE = "candidate"
    REPLAY = "replay"


class Status(StrEnum):
    OK = "ok"
    HTTP_ERROR = "http_error"
    TIMEOUT = "timeout"
    CONNECTION_ERROR = "connection_error"
    CANCELLED = "cancelled"


ANSWER_TRUNCATED = "answer truncated"
"""How an exchange's ``error`` begins when the mirror cut an engine's answer that outgrew the
most it reads (mirror/shadow_client.py ``ANSWER_MAX_BYTES``; no real answer is that long). Its
status is ``connection_error`` (the mirror closed the connection before the answer ended): a
failure of the engine, which the evaluator does not take for a sign of a crash."""


class Endpoint(StrEnum):
    CHAT = "chat"
    COMPLETIONS = "completions"


INT32_MAX = 2**31 - 1
NonNegFloat = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=INT32_MAX)]
"""Token and request counts: stored as 32-bit integers, so larger values are malformed."""
Bytes = Annotated[int, Field(ge=0)]


class TokenLogprob(BaseModel):
    """One generated token with its logprob and the engine's top-k alternatives there.

    Stored under ``capture: full``, tokens are redacted as their joined text (an address
    split over tokens included): a token where a redacted span starts holds its label, those
    further inside are empty, and the alternatives at a changed token are ``[REDACTED n]``;
    the logprob values stay (mirror/privacy.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    token: str
    logprob: Annotated[float, Field(allow_inf_nan=False)]
    top: dict[str, float] = Field(default_factory=dict)


def _fields_of(value: Any) -> Any:
    """A nested record model (``TokenLogprob``) for orjson: its fields; anything else orjson
    cannot encode is refused, and ``to_json`` takes pydantic's way."""
    if isinstance(value, TokenLogprob):
        return value.__dict__
    raise TypeError(f"not encoded directly: {type(value).__name__}")


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)

    schema_version: int = SCHEMA_VERSION
    deployment: Annotated[str, Field(min_length=1, max_length=200)]

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, v: int) -> int:
        if not 1 <= v <= SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {v} is not understood by this build (knows 1..{SCHEMA_VERSION});"
                " upgrade shadow-ab on the consumer side"
            )
        return v

    def to_json(self) -> bytes:
        """The record as JSON: what ``orjson.dumps(self.model_dump(mode="json"))`` gives, byte
        for byte, encoded straight from the fields (a tenth of the CPU on the mirror's records);
        a value orjson cannot encode by itself takes pydantic's way."""
        try:
            return orjson.dumps(self.__dict__, default=_fields_of, option=orjson.OPT_UTC_Z)
        except TypeError:
            return self.to_json_slow()

    def to_json_slow(self) -> bytes:
        """The record as JSON through pydantic's serializer (``to_json``'s reference)."""
        return orjson.dumps(self.model_dump(mode="json"))


class ExchangeRecord(_Record):
    """One engine's answer to one mirrored request."""

    kind: Literal["exchange"] = "exchange"
    pair_id: uuid.UUID
    role: Role
    engine: Annotated[str, Field(min_length=1, max_length=200)]
    """Engine id, e.g. ``vllm@incumbent``; matches the health samples' ``engine``."""
    endpoint: Endpoint
    stream: bool
    model: str | None = None
    sent_at: datetime
    """Wall-clock UTC time the request left the mirror."""
    status: Status
    http_status: Annotated[int, Field(ge=100, le=599)] | None = None
    error: str | None = None

    # Timings (seconds, monotonic clock, relative to sending): docs/architecture.md, "Timing
    # definitions".
    ttft_s: NonNegFloat | None = None
    e2e_s: NonNegFloat | None = None
    tpot_s: NonNegFloat | None = None
    itl_s: list[NonNegFloat] = Field(default_factory=list)

    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None
    finish_reason: str | None = None

    # What was sent and what came back (credentials are never part of the request body kept).
    request: dict[str, Any] = Field(default_factory=dict)
    rewrites: list[str] = Field(default_factory=list)
    output_text: str | None = None
    logprobs: list[TokenLogprob] | None = None

    # Conditions at dispatch.
    inflight_incumbent: Count | None = None
    inflight_candidate: Count | None = None
    guard: dict[str, Any] = Field(default_factory=dict)

    # Synthetic traffic (issue 12): the mirror's own probes, sent to both engines, never to a
    # client; None for client traffic. ``probe_id`` is ``<probe set digest>:<probe id>``
    # (shadow_ab/probes.py).
    synthetic: Literal["probe"] | None = None
    probe_id: Annotated[str, Field(min_length=1, max_length=200)] | None = None

    @field_validator("sent_at")
    @classmethod
    def _aware_utc(cls, v: datetime) -> datetime:
        return _storable(aware_utc(v, "sent_at"), "sent_at")

    @property
    def greedy(self) -> bool:
        """Whether decoding was greedy, so exact-match comparison is meaningful."""
        return float(self.request.get("temperature", 1.0) or 0.0) == 0.0


class HealthSample(_Record):
    """One scrape of one engine's ``/health``, ``/version`` and ``/metrics``."""

    kind: Literal["health"] = "health"
    engine: Annotated[str, Field(min_length=1, max_length=200)]
    role: Role
    flavor: Literal["vllm", "trtllm", "unknown"] = "unknown"
    ts: datetime
    up: bool
    http_status: Annotated[int, Field(ge=100, le=599)] | None = None
    latency_s: NonNegFloat | None = None
    error: str | None = None
    version: str | None = None
    process_start_time: float | None = None
    """Unix seconds the engine process started; a change means a restart."""
    num_running: Count | None = None
    num_waiting: Count | None = None
    kv_cache_usage: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    gpu_mem_bytes: Bytes | None = None
    cpu_mem_bytes: Bytes | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    """Other numeric metrics, by their engine-native names."""

    @field_validator("ts")
    @classmethod
    def _aware_utc(cls, v: datetime) -> datetime:
        return _storable(aware_utc(v, "ts"), "ts")


Record = ExchangeRecord | HealthSample


def _storable(ts: datetime, name: str) -> datetime:
    """``ts`` when the store can hold it; ``ValueError`` naming ``name`` otherwise."""
    if not RECORD_TIME_MIN <= ts < RECORD_TIME_MAX:
        raise ValueError(
            f"{name} {ts.isoformat()} is outside the range the store keeps"
            f" ({RECORD_TIME_MIN:%Y-%m-%d} to {RECORD_TIME_MAX:%Y-%m-%d}, exclusive):"
            " check the clock of the process that made the record"
        )
    return ts


def _explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err["loc"]) or "<record>"
        parts.append(f"{loc}: {err['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def parse_record(payload: bytes | str | dict[str, Any]) -> Record:
    """Parse one record of either kind; raise :class:`RecordError` saying what is wrong."""
    if isinstance(payload, dict):
        obj: Any = payload
    else:
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise RecordError(f"not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise RecordError(f"expected a JSON object, got {type(obj).__name__}")
    kind = obj.get("kind")
    model: type[ExchangeRecord] | type[HealthSample]
    if kind == "exchange":
        model = ExchangeRecord
    elif kind == "health":
        model = HealthSample
    else:
        raise RecordError(f"unknown record kind {kind!r}: expected 'exchange' or 'health'")
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise RecordError(f"invalid {kind} record: {_explain(exc)}") from exc


def parse_exchange(payload: bytes | str | dict[str, Any]) -> ExchangeRecord:
    rec = parse_record(payload)
    if not isinstance(rec, ExchangeRecord):
        raise RecordError(f"expected an exchange record, got kind {rec.kind!r}")
    return rec


def parse_health(payload: bytes | str | dict[str, Any]) -> HealthSample:
    rec = parse_record(payload)
    if not isinstance(rec, HealthSample):
        raise RecordError(f"expected a health record, got kind {rec.kind!r}")
    return rec


def utcnow() -> datetime:
    return datetime.now(UTC)
