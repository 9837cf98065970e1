"""What bounds a record sink's loss: its queue in bytes, and a ledger a SIGKILL cannot erase.

Both record sinks (the direct sink, :mod:`storage.sink`, and the mirror's Kafka sink) hold the
records they accepted in an in-memory queue until their thread writes, sends or spools them.

- :func:`approx_bytes` is a record's size as the queue counts it: about its JSON size, from the
  lengths of its texts and lists, without encoding it (microseconds, on the request path).
  The queues are bounded by this sum as well as by their record count.
- :class:`Ledger` counts, in a 16-byte file mapped into memory (``MAP_SHARED``), the records a
  sink *accepted* and those it *settled* (delivered, made durable in a spool, or dropped and
  counted). The kernel keeps a shared mapping's writes when the process dies, so after a
  ``SIGKILL`` (or an OOM kill) the file still says how many accepted records were in memory,
  unsent: the next process on the same file takes that number (:meth:`Ledger.take_unsettled`)
  and counts them as dropped with reason ``killed``. A record sent but not yet acknowledged
  when the process died is counted too, so the count is an upper bound of what was lost
  (a power cut may lose the file's last writes: the kernel had not written them back).

One ledger file serves one process at a time (``flock``); :class:`LedgerInUse` otherwise.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import struct
import threading
from pathlib import Path
from typing import Any

from shadow_ab.records import ExchangeRecord, HealthSample

log = logging.getLogger(__name__)

_COUNTS = struct.Struct("<QQ")  # accepted, settled
KILLED = "killed"
"""The drop reason of records a previous process accepted and never settled."""


class LedgerInUse(Exception):
    """Another process holds the ledger file."""


def _approx(value: Any, depth: int = 0) -> int:
    # On the mirror's request path (every submit): plain loops, strings measured in place and
    # no union type built per call (3x cheaper than generators over isinstance(v, list | tuple);
    # the same estimate).
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, dict):
        if depth > 8:
            return 64 * len(value)
        size = 2
        for k, v in value.items():
            size += len(k) if type(k) is str else len(str(k))
            size += 6 + len(v) if type(v) is str else 4 + _approx(v, depth + 1)
        return size
    if isinstance(value, (list, tuple)):
        if depth > 8:
            return 16 * len(value)
        size = 2
        for v in value:
            size += 3 + len(v) if type(v) is str else 1 + _approx(v, depth + 1)
        return size
    return 16


def approx_bytes(record: ExchangeRecord | HealthSample) -> int:
    """About the size of ``record`` as JSON, without encoding it."""
    if isinstance(record, HealthSample):
        return 512 + 48 * len(record.metrics) + len(record.error or "")
    size = 512 + len(record.output_text or "") + len(record.error or "")
    size += 11 * len(record.itl_s) + _approx(record.request)
    if record.logprobs:
        size += sum(32 + len(t.token) + sum(len(k) + 12 for k in t.top) for t in record.logprobs)
    return size


class Ledger:
    """Accepted and settled record counts of one sink, kept by the kernel across a SIGKILL.

    ``accept`` is called by whoever hands records in (under the sink's own lock), ``settle``
    by the sink's thread: each field has one writer at a time, an aligned 8-byte store.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise LedgerInUse(f"the ledger {self.path} is in use by another process") from None
        if os.fstat(fd).st_size < _COUNTS.size:
            os.ftruncate(fd, _COUNTS.size)
        self._fd = fd
        self._map = mmap.mmap(fd, _COUNTS.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._accepted, self._settled = _COUNTS.unpack_from(self._map)
        self._lock = threading.Lock()
        self._closed = False

    def take_unsettled(self) -> int:
        """Records a previous process accepted and never settled; the counts start again."""
        with self._lock:
            left = max(0, self._accepted - self._settled)
            self._accepted = self._settled = 0
            _COUNTS.pack_into(self._map, 0, 0, 0)
        return left

    def accept(self, n: int = 1) -> None:
        if self._closed:
            return
        self._accepted += n
        struct.pack_into("<Q", self._map, 0, self._accepted)

    def settle(self, n: int = 1) -> None:
        if self._closed:
            return
        self._settled += n
        struct.pack_into("<Q", self._map, 8, self._settled)

    @property
    def unsettled(self) -> int:
        return max(0, self._accepted - self._settled)

    def close(self) -> None:
        """Release the file (its counts stay for the next process to take)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._map.flush()
            self._map.close()
            os.close(self._fd)  # releases the flock


def open_ledger(path: Path | str) -> Ledger | None:
    """A ledger on ``path``, or None (logged) when it cannot be used: the sink then runs
    without one (a SIGKILL's loss would go uncounted)."""
    try:
        return Ledger(path)
    except (OSError, LedgerInUse, ValueError) as exc:
        log.warning(
            "no ledger of accepted records (%s): a killed process's loss is not counted", exc
        )
        return None
