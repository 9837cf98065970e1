"""A bounded on-disk spool: records wait here while Kafka is away, and survive a restart.

Layout of the spool folder::

    seg-00000000000000000001.log    append-only segment files, in order
    seg-00000000000000000002.log
    cursor                          {"segment": 1, "offset": 4711}: everything before is acked
    lock                            flock'ed by the process using the spool (one at a time)

A segment is a sequence of entries ``<length u32 LE><crc32 u32 LE><payload>``. Payloads are
opaque bytes (the Kafka sink puts topic, key and value in them).

- :meth:`Spool.append` adds an entry at the end of the newest segment (a new segment starts past
  ``segment_bytes``); when the spool's files would grow past ``max_bytes`` the entry is refused,
  counted in :attr:`Spool.dropped`, and False is returned. So is an entry the disk will not take
  (``OSError``: no space left, quota, I/O error; counted in :attr:`Spool.write_errors` too): the
  segment is cut back to its last whole entry and the next append tries again, so the spool
  takes entries again as soon as space comes back. A cursor that cannot be written is kept and
  written later.
- :meth:`Spool.read` hands out the next entries (in order) with an id each; :meth:`Spool.ack`
  marks one delivered. The cursor moves over the contiguous prefix of acked entries, so an entry
  is forgotten only after it and every entry before it were acked; fully acked segments are
  deleted. :meth:`Spool.rewind` hands the unacked entries out again (after a failed send).
- The cursor is written atomically (temporary file + rename) at most every
  ``cursor_interval_s`` and on segment changes and :meth:`Spool.close`; after a crash, entries
  acked since the last write are handed out again (at-least-once: the ingester is idempotent).
- Constructing a :class:`Spool` on a folder takes the folder's lock (:class:`SpoolError` when
  another process holds it) and resumes what a previous process left: the entries after the
  cursor, segments wholly before it deleted. Each segment is read from the cursor (or its start)
  up to its first entry that is not whole (a crash mid-write: short header, short payload or a
  CRC mismatch) and cut there; what was cut is counted in :attr:`Spool.corrupt_bytes` and
  logged.

Thread-safe (one lock). The clock is injectable.

Errors: :class:`~mirror.errors.SpoolError` (a :class:`~mirror.errors.MirrorError`): the folder
cannot be used (not a directory, unreadable cursor, in use by another process).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import orjson

from mirror.errors import SpoolError
from mirror.metrics import SPOOL_BYTES, SPOOL_RECORDS
from shadow_ab.privacy import private_opener

log = logging.getLogger(__name__)

HEADER = struct.Struct("<II")
MAX_ENTRY_BYTES = 64 * 1024 * 1024
"""A length field above this is corruption, not an entry."""
SEGMENT_RE = re.compile(r"^seg-(\d{20})\.log$")
CURSOR_FILE = "cursor"
LOCK_FILE = "lock"


@dataclass(frozen=True, slots=True)
class SpoolEntry:
    """One entry handed out by :meth:`Spool.read`; ack it by ``id`` once delivered."""

    id: int
    payload: bytes


def _segment_name(seq: int) -> str:
    return f"seg-{seq:020d}.log"


class Spool:
    """Append-only segment files with an ack cursor, bounded by total bytes."""

    def __init__(
        self,
        directory: Path | str,
        *,
        max_bytes: int,
        segment_bytes: int = 16 * 1024 * 1024,
        cursor_interval_s: float = 1.0,
        fsync: bool = False,
        clock: Callable[[], float] = time.monotonic,
        publish_metrics: bool = True,
    ) -> None:
        if max_bytes < HEADER.size + 1:
            raise ValueError(f"spool max_bytes must be larger than {HEADER.size}, got {max_bytes}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.cursor_interval_s = cursor_interval_s
        self.fsync = fsync
        self._clock = clock
        self._publish = publish_metrics
        self._lock = threading.Lock()

        self.dropped = 0
        """Entries refused because the spool was full."""
        self.corrupt_bytes = 0
        """Bytes cut from torn segment tails when the spool was opened."""
        self.write_errors = 0
        """Entries refused because the disk would not take them (also in :attr:`dropped`)."""
        self._write_error_logged_at = -1e9

        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise SpoolError(f"cannot create the spool folder {self.directory}: {exc}") from exc
        if not self.directory.is_dir():
            raise SpoolError(f"the spool path {self.directory} is not a folder")
        self._folder_lock = self._lock_folder()

        # segment seq -> size in bytes (every segment file that exists)
        self._sizes: dict[int, int] = {}
        self._pending = 0  # entries not yet acked
        try:
            self._ack_seg, self._ack_off = self._load_cursor()
            self._recover()
        except BaseException:
            self._folder_lock.close()
            raise
        if not self._sizes:
            self._sizes[self._ack_seg] = 0
        self._write_seq = max(self._sizes)
        self._writer: BinaryIO | None = open(  # noqa: SIM115
            self._path(self._write_seq), "ab", opener=private_opener
        )
        # Reading: the next entry to hand out, and the entries handed out, not yet acked.
        self._read_seg, self._read_off = self._ack_seg, self._ack_off
        self._reader: BinaryIO | None = None
        self._reader_seq = -1
        self._next_id = 0
        self._out: deque[tuple[int, int, int]] = deque()  # (id, segment, end offset)
        self._acked: set[int] = set()
        self._cursor_dirty = False
        self._cursor_written_at = clock()
        self._closed = False
        self._update_metrics()

    # -- state ------------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Entries not yet acked (handed out or not)."""
        with self._lock:
            return self._pending

    @property
    def size_bytes(self) -> int:
        """Bytes of the spool's segment files."""
        with self._lock:
            return sum(self._sizes.values())

    def unread(self) -> int:
        """Entries not yet handed out by :meth:`read`."""
        with self._lock:
            return self._pending - len(self._out)

    # -- writing ----------------------------------------------------------------------------------

    def append(self, payload: bytes) -> bool:
        """Add one entry; False (counted in :attr:`dropped`) when the spool is full."""
        entry = HEADER.pack(len(payload), zlib.crc32(payload)) + payload
        with self._lock:
            if self._closed:
                raise SpoolError("the spool is closed")
            if sum(self._sizes.values()) + len(entry) > self.max_bytes:
                self.dropped += 1
                return False
            try:
                self._write(entry)
            except OSError as exc:
                self._write_failed(exc)
                return False
            self._sizes[self._write_seq] += len(entry)
            self._pending += 1
            self._update_metrics()
        return True

    def _write(self, entry: bytes) -> None:
        """Write one whole entry at the end (caller holds the lock); OSError leaves the sizes
        as they were."""
        if self._sizes[self._write_seq] > 0 and (
            self._sizes[self._write_seq] + len(entry) > self.segment_bytes
        ):
            self._roll()
        if self._writer is None:
            self._writer = open(  # noqa: SIM115
                self._path(self._write_seq), "ab", opener=private_opener
            )
        self._writer.write(entry)
        self._writer.flush()
        if self.fsync:
            os.fsync(self._writer.fileno())

    def _write_failed(self, exc: OSError) -> None:
        """The disk refused an entry: drop the writer (and any bytes of the entry it holds),
        cut the segment back to its last whole entry; the next append opens it again."""
        self.dropped += 1
        self.write_errors += 1
        if self._writer is not None:
            with contextlib.suppress(OSError):  # the unwritten bytes go with the buffer
                self._writer.close()
            self._writer = None
        try:
            os.truncate(self._path(self._write_seq), self._sizes[self._write_seq])
        except OSError as cut_exc:  # a torn tail left is cut when the spool is opened again
            log.warning(
                "cannot cut spool segment %s back: %s", self._path(self._write_seq), cut_exc
            )
        now = self._clock()
        if now - self._write_error_logged_at >= 10.0:
            self._write_error_logged_at = now
            log.error(
                "cannot write to the spool %s (%s): records are dropped (spool_full) until"
                " space comes back; free space or give kafka.spool_dir a larger volume",
                self.directory,
                exc,
            )

    def _roll(self) -> None:
        new = open(self._path(self._write_seq + 1), "ab", opener=private_opener)  # noqa: SIM115
        if self._writer is not None:
            self._writer.close()
        self._writer = new
        self._write_seq += 1
        self._sizes[self._write_seq] = 0

    # -- reading and acking -----------------------------------------------------------------------

    def read(self, max_entries: int) -> list[SpoolEntry]:
        """The next up to ``max_entries`` entries after those already handed out, in order."""
        out: list[SpoolEntry] = []
        with self._lock:
            while len(out) < max_entries:
                size = self._sizes.get(self._read_seg)
                if size is None or self._read_off >= size:
                    later = [s for s in self._sizes if s > self._read_seg]
                    if not later:
                        break
                    self._read_seg, self._read_off = min(later), 0
                    continue
                reader = self._reader_for(self._read_seg)
                reader.seek(self._read_off)
                header = reader.read(HEADER.size)
                length, _crc = HEADER.unpack(header)
                payload = reader.read(length)
                end = self._read_off + HEADER.size + length
                self._out.append((self._next_id, self._read_seg, end))
                out.append(SpoolEntry(self._next_id, payload))
                self._next_id += 1
                self._read_off = end
        return out

    def ack(self, entry_id: int) -> None:
        """Mark one handed-out entry delivered; the cursor moves over acked prefixes."""
        with self._lock:
            if not self._out or entry_id < self._out[0][0]:
                return  # stale: from before a rewind, or already acked
            self._acked.add(entry_id)
            moved = False
            while self._out and self._out[0][0] in self._acked:
                eid, seg, end = self._out.popleft()
                self._acked.discard(eid)
                self._pending -= 1
                if seg != self._ack_seg:
                    self._ack_seg = seg
                    self._cursor_dirty = True
                    self._delete_before(seg)
                self._ack_off = end
                moved = True
            whole = self._ack_off >= self._sizes.get(self._ack_seg, 0)
            if moved and self._ack_seg != self._write_seq and whole:  # a whole segment acked
                nxt = min(s for s in self._sizes if s > self._ack_seg)
                self._delete_before(nxt)
                self._ack_seg, self._ack_off = nxt, 0
            if moved:
                self._cursor_dirty = True
                if self._pending == 0:
                    self._reset_when_empty()
                self._maybe_write_cursor(force=False)
                self._update_metrics()

    def rewind(self) -> int:
        """Forget what was handed out and not acked, so :meth:`read` hands it out again.
        Returns how many entries that was; acks for them are ignored from now on."""
        with self._lock:
            n = len(self._out)
            self._out.clear()
            self._acked.clear()
            self._read_seg, self._read_off = self._ack_seg, self._ack_off
        return n

    def sync(self) -> None:
        """Write the cursor now if it moved."""
        with self._lock:
            self._maybe_write_cursor(force=True)

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._maybe_write_cursor(force=True)
            if self._writer is not None:
                with contextlib.suppress(OSError):
                    self._writer.close()
            if self._reader is not None:
                self._reader.close()
                self._reader = None
            self._folder_lock.close()  # releases the flock
            self._closed = True

    # -- internals (caller holds the lock) --------------------------------------------------------

    def _lock_folder(self) -> BinaryIO:
        """An exclusive flock on ``lock`` in the folder: two processes on one spool would
        interleave their segments and acks. The OS releases it when the process dies."""
        f = open(self.directory / LOCK_FILE, "ab", opener=private_opener)  # noqa: SIM115
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            raise SpoolError(
                f"the spool folder {self.directory} is in use by another process: give each"
                " mirror process its own kafka.spool_dir"
            ) from None
        return f

    def _path(self, seq: int) -> Path:
        return self.directory / _segment_name(seq)

    def _reader_for(self, seq: int) -> BinaryIO:
        if self._reader is None or self._reader_seq != seq:
            if self._reader is not None:
                self._reader.close()
            self._reader = open(self._path(seq), "rb")  # noqa: SIM115
            self._reader_seq = seq
        return self._reader

    def _delete_before(self, seq: int) -> None:
        for old in sorted(s for s in self._sizes if s < seq):
            if self._reader_seq == old and self._reader is not None:
                self._reader.close()
                self._reader = None
            self._path(old).unlink(missing_ok=True)
            del self._sizes[old]

    def _reset_when_empty(self) -> None:
        """Everything is acked: start over with one empty segment so disk space comes back."""
        if sum(self._sizes.values()) == 0:
            return
        if self._writer is not None:
            with contextlib.suppress(OSError):
                self._writer.close()
            self._writer = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        new_seq = self._write_seq + 1
        for seq in list(self._sizes):
            self._path(seq).unlink(missing_ok=True)
        self._sizes = {new_seq: 0}
        self._write_seq = new_seq
        try:
            self._writer = open(self._path(new_seq), "ab", opener=private_opener)  # noqa: SIM115
        except OSError as exc:  # opened again by the next append
            log.warning("cannot open a new spool segment: %s", exc)
        self._ack_seg, self._ack_off = new_seq, 0
        self._read_seg, self._read_off = new_seq, 0
        self._cursor_dirty = True
        self._maybe_write_cursor(force=True)

    def _maybe_write_cursor(self, *, force: bool) -> None:
        if not self._cursor_dirty:
            return
        now = self._clock()
        if not force and now - self._cursor_written_at < self.cursor_interval_s:
            return
        tmp = self.directory / (CURSOR_FILE + ".tmp")
        try:
            tmp.write_bytes(orjson.dumps({"segment": self._ack_seg, "offset": self._ack_off}))
            os.replace(tmp, self.directory / CURSOR_FILE)
        except OSError as exc:  # disk full: keep it dirty, write it later (acks are replayed)
            log.warning("cannot write the spool cursor %s: %s", tmp, exc)
            self._cursor_written_at = now
            return
        self._cursor_dirty = False
        self._cursor_written_at = now

    def _update_metrics(self) -> None:
        if self._publish:
            SPOOL_RECORDS.set(self._pending)
            SPOOL_BYTES.set(sum(self._sizes.values()))

    def _load_cursor(self) -> tuple[int, int]:
        path = self.directory / CURSOR_FILE
        if not path.exists():
            return 1, 0
        try:
            obj = orjson.loads(path.read_bytes())
            return int(obj["segment"]), int(obj["offset"])
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise SpoolError(
                f"the spool cursor {path} is unreadable ({exc}); move the spool folder aside"
                " to start a fresh one"
            ) from exc

    def _recover(self) -> None:
        """Find the segments, drop those before the cursor, count and check the rest."""
        for path in self.directory.iterdir():
            m = SEGMENT_RE.match(path.name)
            if not m:
                continue
            seq = int(m.group(1))
            if seq < self._ack_seg:
                path.unlink()  # fully acked; the process died before deleting it
                continue
            self._sizes[seq] = path.stat().st_size
        for seq in sorted(self._sizes):
            start = self._ack_off if seq == self._ack_seg else 0
            count, valid_end = _scan(self._path(seq), start)
            if valid_end < self._sizes[seq]:
                cut = self._sizes[seq] - valid_end
                self.corrupt_bytes += cut
                log.warning(
                    "spool segment %s has a torn tail: cutting %d bytes after %d whole entries",
                    self._path(seq),
                    cut,
                    count,
                )
                os.truncate(self._path(seq), valid_end)
                self._sizes[seq] = valid_end
            self._pending += count
        if self._sizes and self._ack_seg not in self._sizes:
            # The cursor's segment is gone (it was empty): start at the first one left.
            self._ack_seg, self._ack_off = min(self._sizes), 0
        if self._pending:
            log.info(
                "spool %s: resuming %d unsent records (%d bytes)",
                self.directory,
                self._pending,
                sum(self._sizes.values()),
            )


def _scan(path: Path, start: int) -> tuple[int, int]:
    """(whole entries from ``start``, offset just past the last whole entry)."""
    count = 0
    pos = start
    with open(path, "rb") as f:
        f.seek(start)
        while True:
            header = f.read(HEADER.size)
            if len(header) < HEADER.size:
                return count, pos
            length, crc = HEADER.unpack(header)
            if length > MAX_ENTRY_BYTES:
                return count, pos
            payload = f.read(length)
            if len(payload) < length or zlib.crc32(payload) != crc:
                return count, pos
            count += 1
            pos += HEADER.size + length
