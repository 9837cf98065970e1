"""What flows between the steps: a decoded message, and a batch of them with its offsets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from ingester.decode import Poison
from shadow_ab.records import ExchangeRecord, HealthSample, Record
from storage.write import ExchangeRow


class Partition(NamedTuple):
    """A topic partition, whichever the Kafka client (:mod:`ingester.clients`)."""

    topic: str
    partition: int


class Message(Protocol):
    """The part of a Kafka message the ingester reads (:class:`ingester.confluent_client.Record`;
    the tests' fakes)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...


@dataclass
class Decoded:
    """One message and what decoding made of it."""

    message: Message
    result: Record | ExchangeRow | Poison
    """An :class:`~storage.write.ExchangeRow` from the ``rows`` decoder: an exchange record
    as its store row, stored like the record."""

    @property
    def partition(self) -> Partition:
        return Partition(self.message.topic, self.message.partition)


@dataclass
class DeadLetter:
    """A poison message on its way to the dead-letter topic; ``acked`` once Kafka has it."""

    message: Message
    poison: Poison
    acked: bool = False


@dataclass
class Batch:
    """Records to write in one go, the poison to dead-letter, and the offsets to commit after.

    ``offsets`` maps each partition to the next offset to consume (last offset + 1), which is
    what Kafka expects to be committed.
    """

    started_at: float
    exchanges: list[ExchangeRecord | ExchangeRow] = field(default_factory=list)
    exchange_messages: list[Message] = field(default_factory=list)
    health: list[HealthSample] = field(default_factory=list)
    health_messages: list[Message] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    offsets: dict[Partition, int] = field(default_factory=dict)
    size: int = 0
    exchanges_done: bool = False
    health_done: bool = False

    def add(self, item: Decoded) -> None:
        result = item.result
        if isinstance(result, Poison):
            self.dead_letters.append(DeadLetter(item.message, result))
        elif isinstance(result, ExchangeRow | ExchangeRecord):
            self.exchanges.append(result)
            self.exchange_messages.append(item.message)
        else:
            self.health.append(result)
            self.health_messages.append(item.message)
        tp = item.partition
        next_offset = item.message.offset + 1
        if next_offset > self.offsets.get(tp, -1):
            self.offsets[tp] = next_offset
        self.size += 1
