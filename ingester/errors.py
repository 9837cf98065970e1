"""The ingester's exceptions: which failures are retried and which stop the process.

Errors::

    IngestError                     base of everything the ingester raises
    ├── SettingsError               configuration is missing or wrong (message says what to fix)
    ├── TransientError              retry the same batch later (partitions stay paused)
    │   ├── StoreDown               the store is unreachable (storage.errors.StoreUnavailable)
    │   └── DeadLetterUnavailable   Kafka did not acknowledge a dead-letter message
    └── StoreRejected               the store refused a whole batch for a reason that will not
                                    go away by waiting (e.g. tables missing: run `shadow-ab db
                                    upgrade`); the process stops without committing offsets

Poison messages are not errors of the ingester: they become :class:`ingester.decode.Poison`
values, are sent to the dead-letter topic and are never retried.
"""

from __future__ import annotations


class IngestError(Exception):
    """Base of the ingester's exceptions."""


class SettingsError(IngestError):
    """The settings are missing or inconsistent; the message says how to fix them."""


class TransientError(IngestError):
    """A failure that waiting fixes: retry the same batch with backoff."""


class StoreDown(TransientError):
    """The store is unreachable."""


class DeadLetterUnavailable(TransientError):
    """A dead-letter message was not acknowledged by Kafka."""


class StoreRejected(IngestError):
    """The store refused every record of a batch: a systemic problem, not a bad record."""
