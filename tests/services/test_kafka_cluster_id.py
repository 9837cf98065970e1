"""The local broker's KRaft cluster id: made as Kafka's ``Uuid.randomUuid()`` makes it, and
passed to ``kafka-storage format`` so that an id starting with '-' is not read as an option."""

from __future__ import annotations

import base64
import random
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from kafka_throwaway import PrivateKafka

from shadow_ab.dev.services import kafka as kafka_module
from shadow_ab.dev.services.base import ServicesSettings
from shadow_ab.dev.services.kafka import LocalKafka, new_cluster_id

# `kafka-storage format -t ID` refused this id: "argument --cluster-id/-t: expected one argument".
DASHED_ID = "-e9Gsu0AQ8aNDJlC7F53rA"


def _text(u: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(u.bytes).decode().rstrip("=")


def _source(uuids: Iterable[uuid.UUID]) -> tuple[Callable[[], uuid.UUID], list[uuid.UUID]]:
    """A uuid source that hands out ``uuids`` in order and keeps what it handed out."""
    pending = iter(uuids)
    drawn: list[uuid.UUID] = []

    def next_uuid() -> uuid.UUID:
        drawn.append(next(pending))
        return drawn[-1]

    return next_uuid, drawn


def _seeded_uuid4(seed: int) -> Callable[[], uuid.UUID]:
    rng = random.Random(seed)
    return lambda: uuid.UUID(int=rng.getrandbits(128), version=4)


def test_an_id_starting_with_a_dash_is_drawn_again() -> None:
    dashed = uuid.UUID(bytes=base64.urlsafe_b64decode(DASHED_ID + "=="))
    good = uuid.UUID("7c1d1e0a-4b0f-4e7e-9a57-3f7f0c1a2b3c")
    assert _text(dashed) == DASHED_ID
    source, drawn = _source([dashed, dashed, good])
    assert new_cluster_id(source) == _text(good)
    assert drawn == [dashed, dashed, good]


def test_kafkas_reserved_ids_are_drawn_again() -> None:
    # Kafka's Uuid.ZERO_UUID (no id) and Uuid.ONE_UUID (METADATA_TOPIC_ID) are never random ids.
    good = uuid.UUID("0b8f3c52-9e1d-4a6b-8c2d-5e4f3a2b1c0d")
    source, drawn = _source([uuid.UUID(int=0), uuid.UUID(int=1), good])
    assert new_cluster_id(source) == _text(good)
    assert len(drawn) == 3


def test_seeded_ids_never_start_with_a_dash_and_are_kafka_uuids() -> None:
    draws = 4000
    source = _seeded_uuid4(20261201)
    counting, drawn = _source(source() for _ in range(draws * 2))
    ids = [new_cluster_id(counting) for _ in range(draws)]
    rejected = len(drawn) - draws
    # About one random id in 64 starts with '-': the seed must have exercised the redraw.
    assert 20 <= rejected <= 150, rejected
    assert not any(i.startswith("-") for i in ids)
    for i in ids:
        assert len(i) == 22  # 16 bytes, unpadded base64url, as Kafka's Uuid.toString()
        assert uuid.UUID(bytes=base64.urlsafe_b64decode(i + "==")).int > 1
    assert len(set(ids)) == draws


def test_format_passes_the_id_as_one_argument(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands: list[list[str]] = []
    monkeypatch.setattr(kafka_module, "new_cluster_id", lambda: DASHED_ID)
    monkeypatch.setattr(kafka_module, "run", lambda cmd, *a, **k: commands.append(list(cmd)) or "")
    kafka = LocalKafka(ServicesSettings(root=tmp_path))
    kafka._format("java")
    [cmd] = commands
    assert f"--cluster-id={DASHED_ID}" in cmd
    assert DASHED_ID not in cmd and "-t" not in cmd and "--cluster-id" not in cmd
    assert cmd[cmd.index("kafka.tools.StorageTool") + 1] == "format"


@pytest.mark.services
def test_kafka_storage_formats_with_an_id_starting_with_a_dash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real StorageTool: the broker jars linked from `shadow-ab services up` (or resolved by
    Maven from its cache), storage formatted as `up` formats it, nothing started."""
    kafka = PrivateKafka(tmp_path).kafka
    java = kafka._java()
    kafka._resolve_jars()
    kafka._write_config()
    monkeypatch.setattr(kafka_module, "new_cluster_id", lambda: DASHED_ID)
    kafka._format(java)
    meta = (kafka.data / "meta.properties").read_text()
    assert f"cluster.id={DASHED_ID}" in meta.splitlines()
