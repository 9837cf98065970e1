"""The ingester's fast decoder: the record schemas as msgspec structs, validated in compiled code.

:func:`decode_fast` parses one message value straight into the records of
:mod:`shadow_ab.records` (the same pydantic classes, the same values) about ten times faster
than pydantic does. It is a strict subset of :func:`ingester.decode.decode`: it accepts only
what pydantic accepts, and builds exactly what pydantic builds from it. Anything it is not
certain of (a value pydantic would coerce, such as ``"5"`` for a count or ``5.0`` for a status,
a naive or out-of-range time, a non-finite float, any invalid or unusual message) makes it
return None, and the caller takes pydantic's path, which accepts, coerces or names the
problem exactly as before. ``tests/ingester/test_ingest_fastdecode.py`` feeds both decoders the
same valid and invalid messages, every field's bad types and bounds, and checks that they agree.

The structs below repeat the fields of :class:`~shadow_ab.records.ExchangeRecord` and
:class:`~shadow_ab.records.HealthSample`; a test fails when the two differ (a field added to
the records must be added here too).
"""

from __future__ import annotations

import math
import re
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta
from pydantic import BaseModel

from shadow_ab.records import (
    INT32_MAX,
    RECORD_TIME_MAX,
    RECORD_TIME_MIN,
    SCHEMA_VERSION,
    Endpoint,
    ExchangeRecord,
    HealthSample,
    Record,
    Role,
    Status,
    TokenLogprob,
)

Name = Annotated[str, Meta(min_length=1, max_length=200)]
NonNegFloat = Annotated[float, Meta(ge=0.0)]  # finiteness checked after decoding
Count = Annotated[int, Meta(ge=0, le=INT32_MAX)]
Bytes = Annotated[int, Meta(ge=0)]
HttpStatus = Annotated[int, Meta(ge=100, le=599)]
Version = Annotated[int, Meta(ge=1, le=SCHEMA_VERSION)]
Fraction = Annotated[float, Meta(ge=0.0, le=1.0)]


class _Logprob(msgspec.Struct, forbid_unknown_fields=True):
    token: str
    logprob: float  # finiteness checked after decoding
    top: dict[str, float] = {}


# The fields in the pydantic models' order (kw_only lets defaults come first), so that
# msgspec.structs.asdict gives the models' __dict__ as pydantic builds it.
class _Exchange(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    schema_version: Version = SCHEMA_VERSION
    deployment: Name
    kind: Literal["exchange"] = "exchange"
    pair_id: uuid.UUID
    role: Role
    engine: Name
    endpoint: Endpoint
    stream: bool
    model: str | None = None
    sent_at: msgspec.Raw  # read by _time
    status: Status
    http_status: HttpStatus | None = None
    error: str | None = None
    ttft_s: NonNegFloat | None = None
    e2e_s: NonNegFloat | None = None
    tpot_s: NonNegFloat | None = None
    itl_s: list[NonNegFloat] = []
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None
    finish_reason: str | None = None
    request: dict[str, Any] = {}
    rewrites: list[str] = []
    output_text: str | None = None
    logprobs: list[_Logprob] | None = None
    inflight_incumbent: Count | None = None
    inflight_candidate: Count | None = None
    guard: dict[str, Any] = {}


class _Health(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    schema_version: Version = SCHEMA_VERSION
    deployment: Name
    kind: Literal["health"] = "health"
    engine: Name
    role: Role
    flavor: Literal["vllm", "trtllm", "unknown"] = "unknown"
    ts: msgspec.Raw  # read by _time
    up: bool
    http_status: HttpStatus | None = None
    latency_s: NonNegFloat | None = None
    error: str | None = None
    version: str | None = None
    process_start_time: float | None = None
    num_running: Count | None = None
    num_waiting: Count | None = None
    kv_cache_usage: Fraction | None = None
    gpu_mem_bytes: Bytes | None = None
    cpu_mem_bytes: Bytes | None = None
    metrics: dict[str, float] = {}


_DECODERS: dict[str, msgspec.json.Decoder[Any]] = {
    "exchange": msgspec.json.Decoder(_Exchange),
    "health": msgspec.json.Decoder(_Health),
}
STRUCTS: dict[type[Any], type[msgspec.Struct]] = {
    ExchangeRecord: _Exchange,
    HealthSample: _Health,
    TokenLogprob: _Logprob,
}
"""Each pydantic record model and the struct that decodes it (the tests compare their fields)."""
_isfinite = math.isfinite
_M = TypeVar("_M", bound=BaseModel)
_decode_time = msgspec.json.Decoder(datetime).decode
_LONG_FRACTION = re.compile(rb"[.,][0-9]{7}").search
_asdict = msgspec.structs.asdict
_set_attr = object.__setattr__


def _time(raw: msgspec.Raw) -> datetime | None:
    """The time in ``raw`` (its JSON text) in UTC as pydantic's validator makes it, or None
    when pydantic could refuse or read it otherwise: no zone, out of the store's range, or more
    than six digits of a second (msgspec rounds them, pydantic truncates)."""
    if _LONG_FRACTION(raw) is not None:
        return None
    try:
        ts = _decode_time(raw)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    if ts.tzinfo is None:
        return None
    ts = ts.astimezone(UTC)
    return ts if RECORD_TIME_MIN <= ts < RECORD_TIME_MAX else None


def _finite(values: list[float]) -> bool:
    """Whether every value (all >= 0: the schema said so) is finite: their sum is then, unless
    it overflows, and a NaN or an infinity makes it NaN or infinite."""
    return _isfinite(sum(values)) or all(map(_isfinite, values))


def _new(cls: type[_M], values: dict[str, Any]) -> _M:
    """An instance of the pydantic model ``cls`` holding ``values`` (already validated, in the
    model's field order), built as ``model_construct`` builds one minus its default handling."""
    obj = cls.__new__(cls)
    _set_attr(obj, "__dict__", values)
    _set_attr(obj, "__pydantic_fields_set__", set(values))
    _set_attr(obj, "__pydantic_extra__", None)
    _set_attr(obj, "__pydantic_private__", None)
    return obj


def _exchange(s: _Exchange) -> ExchangeRecord | None:
    sent_at = _time(s.sent_at)
    if sent_at is None:
        return None
    for v in (s.ttft_s, s.e2e_s, s.tpot_s):
        if v is not None and not _isfinite(v):
            return None
    if s.itl_s and not _finite(s.itl_s):
        return None
    values = _asdict(s)
    values["sent_at"] = sent_at
    if s.logprobs is not None:
        logprobs = []
        for t in s.logprobs:
            if not _isfinite(t.logprob):
                return None
            logprobs.append(_new(TokenLogprob, _asdict(t)))
        values["logprobs"] = logprobs
    return _new(ExchangeRecord, values)


def _health(s: _Health) -> HealthSample | None:
    ts = _time(s.ts)
    if ts is None or (s.latency_s is not None and not _isfinite(s.latency_s)):
        return None
    values = _asdict(s)
    values["ts"] = ts
    return _new(HealthSample, values)


def decode_fast(value: bytes, kind: str) -> Record | None:
    """The record ``value`` holds, decoded by schema in compiled code; None when this decoder is
    not certain pydantic would build exactly this record (take pydantic's path then)."""
    decoder = _DECODERS.get(kind)
    if decoder is None:
        return None
    try:
        s = decoder.decode(value)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    return _exchange(s) if kind == "exchange" else _health(s)
