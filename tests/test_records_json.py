"""``to_json`` encodes records straight from their fields, byte for byte as pydantic's serializer
did (``to_json_slow``), and falls back to it for values orjson cannot encode by itself."""

from __future__ import annotations

import enum
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import orjson
import pytest
from factories import numbered_exchange, numbered_health

from shadow_ab.records import ExchangeRecord, HealthSample, Role, Status, TokenLogprob


class Color(enum.Enum):
    RED = "red"


def _exchange(**over: Any) -> ExchangeRecord:
    base = numbered_exchange("dep", 3)
    return ExchangeRecord.model_construct(**{**base.__dict__, **over})


CASES: list[Any] = [
    numbered_exchange("dep", 1),
    numbered_health("dep", 1),
    _exchange(
        logprobs=[
            TokenLogprob(token="a", logprob=-0.25, top={"a": -0.25, "b": -2.0}),
            TokenLogprob(token="\u00e9\U0001f600", logprob=0.0),
        ],
        error='boom \u0000 "quoted"',
        itl_s=[0.1, 1e-9, 0.0, 12345.678901],
        sent_at=datetime(2026, 11, 30, 3, 0, 0, 123000, tzinfo=UTC),
    ),
    _exchange(sent_at=datetime(2026, 11, 30, 3, 0, tzinfo=timezone(timedelta(hours=2)))),
    _exchange(sent_at=datetime(2026, 11, 30, 3, 0)),  # naive: built without validation
    _exchange(
        request={
            "n": None,
            "t": (1, 2),
            "big": 2**63 - 1,
            "neg": -(2**63),
            "f": 1e308,
            "tiny": 5e-324,
            "when": datetime(2026, 1, 1, tzinfo=UTC),
            "id": uuid.UUID(int=5),
            "role": Role.REPLAY,
            "status": Status.OK,
            "nested": [{"a": [True, False, None, 0.5, "x"]}],
        },
        guard={"color": Color.RED, "rate": float("inf"), "nan": float("nan")},
    ),
    HealthSample.model_construct(
        **{**numbered_health("dep", 2).__dict__, "metrics": {"x": float("inf"), "y": -0.0}}
    ),
    # values orjson refuses by itself: pydantic's way decides (and may refuse too)
    _exchange(request={"bytes": b"abc"}),
    _exchange(request={"set": {1}}),
    _exchange(request={1: "int key"}),
    _exchange(guard={"big": 2**70}),
]


@pytest.mark.parametrize("rec", CASES)
def test_to_json_is_byte_for_byte_pydantic_s(rec: Any) -> None:
    try:
        expected: bytes | type[Exception] = rec.to_json_slow()
    except Exception as exc:  # pydantic's way refuses it: so must the fast one, the same way
        with pytest.raises(type(exc)):
            rec.to_json()
        return
    assert rec.to_json() == expected
    assert orjson.loads(rec.to_json()) == orjson.loads(expected)
