"""The on-disk spool: order, acks, the byte bound, restarts and torn segment tails."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from mirror.spool import HEADER, Spool, SpoolError


def payloads(n: int, size: int = 20, start: int = 0) -> list[bytes]:
    return [f"{i:08d}".encode() + b"x" * (size - 8) for i in range(start, start + n)]


def drain(spool: Spool) -> list[bytes]:
    out: list[bytes] = []
    while True:
        entries = spool.read(7)
        if not entries:
            return out
        for e in entries:
            out.append(e.payload)
            spool.ack(e.id)


def test_entries_come_back_in_order_across_segments(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=10**6, segment_bytes=200)
    data = payloads(50)
    assert all(spool.append(p) for p in data)
    assert len(list(tmp_path.glob("seg-*.log"))) > 3  # 28-byte entries, 200-byte segments
    assert len(spool) == 50
    assert drain(spool) == data
    assert len(spool) == 0
    # Everything acked: the segments are gone but one empty one.
    assert spool.size_bytes == 0
    assert [p.stat().st_size for p in tmp_path.glob("seg-*.log")] == [0]
    spool.close()


def test_unacked_entries_are_handed_out_again_after_rewind(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=10**6)
    data = payloads(5)
    for p in data:
        spool.append(p)
    first = spool.read(5)
    spool.ack(first[0].id)
    spool.ack(first[2].id)  # out of order: the cursor stops at the gap
    assert len(spool) == 4
    assert spool.rewind() == 4
    spool.ack(first[1].id)  # stale ack from before the rewind: ignored
    again = spool.read(10)
    assert [e.payload for e in again] == data[1:]
    for e in again:
        spool.ack(e.id)
    assert len(spool) == 0
    spool.close()


def test_bound_refuses_and_counts(tmp_path: Path) -> None:
    entry = HEADER.size + 20
    spool = Spool(tmp_path, max_bytes=entry * 10, segment_bytes=entry * 3)
    results = [spool.append(p) for p in payloads(15)]
    assert results == [True] * 10 + [False] * 5
    assert spool.dropped == 5
    assert spool.size_bytes <= entry * 10
    # Acking frees room (whole segments are deleted once the cursor passes them).
    for e in spool.read(6):
        spool.ack(e.id)
    assert spool.size_bytes <= entry * 4
    assert spool.append(b"y" * 20)
    spool.close()


def test_restart_resumes_unsent_entries(tmp_path: Path) -> None:
    data = payloads(30)
    spool = Spool(tmp_path, max_bytes=10**6, segment_bytes=100)
    for p in data:
        spool.append(p)
    for e in spool.read(12):
        spool.ack(e.id)
    spool.close()

    again = Spool(tmp_path, max_bytes=10**6, segment_bytes=100)
    assert len(again) == 18
    assert drain(again) == data[12:]
    again.close()
    third = Spool(tmp_path, max_bytes=10**6)
    assert len(third) == 0
    third.close()


def test_crash_without_cursor_write_resends_at_least_once(tmp_path: Path) -> None:
    data = payloads(10)
    spool = Spool(tmp_path, max_bytes=10**6, cursor_interval_s=3600.0)
    for p in data:
        spool.append(p)
    spool.sync()
    for e in spool.read(4):
        spool.ack(e.id)  # cursor not written yet (interval): a crash now...
    spool._folder_lock.close()  # (the OS releases a dead process's lock)
    # ...and a new process on the same folder (the old one never closed).
    again = Spool(tmp_path, max_bytes=10**6)
    assert drain(again) == data  # nothing lost; the 4 acked ones come again (idempotent sink)
    again.close()
    spool.close()  # only now, so the first process's files stay open like a crashed one's


def test_torn_tail_is_cut_and_the_rest_survives(tmp_path: Path) -> None:
    data = payloads(8)
    spool = Spool(tmp_path, max_bytes=10**6)
    for p in data:
        spool.append(p)
    spool.close()
    (seg,) = tmp_path.glob("seg-*.log")
    size = seg.stat().st_size
    with open(seg, "r+b") as f:  # a crash half-way through writing the last entry
        f.truncate(size - 5)

    again = Spool(tmp_path, max_bytes=10**6)
    assert again.corrupt_bytes == HEADER.size + 20 - 5
    assert len(again) == 7
    assert again.append(b"after the crash")  # appends land after the last whole entry
    assert drain(again) == [*data[:7], b"after the crash"]
    again.close()


def test_corrupt_entry_is_detected_by_crc(tmp_path: Path) -> None:
    data = payloads(4)
    spool = Spool(tmp_path, max_bytes=10**6)
    for p in data:
        spool.append(p)
    spool.close()
    (seg,) = tmp_path.glob("seg-*.log")
    raw = bytearray(seg.read_bytes())
    raw[-3] ^= 0xFF  # flip bits in the last payload
    seg.write_bytes(bytes(raw))
    again = Spool(tmp_path, max_bytes=10**6)
    assert len(again) == 3
    assert drain(again) == data[:3]
    again.close()


def test_unreadable_cursor_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "cursor").write_bytes(b"{not json")
    with pytest.raises(SpoolError, match="move the spool folder aside"):
        Spool(tmp_path, max_bytes=10**6)


def test_cursor_file_is_json_with_segment_and_offset(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=10**6)
    for p in payloads(3):
        spool.append(p)
    (e, *_) = spool.read(1)
    spool.ack(e.id)
    spool.sync()
    cursor = orjson.loads((tmp_path / "cursor").read_bytes())
    assert cursor["offset"] == HEADER.size + 20
    spool.close()


def test_one_process_at_a_time(tmp_path: Path) -> None:
    with (
        Spool(tmp_path, max_bytes=10**6),
        pytest.raises(SpoolError, match="in use by another process"),
    ):
        Spool(tmp_path, max_bytes=10**6)
    with Spool(tmp_path, max_bytes=10**6) as again:  # free once closed
        assert len(again) == 0
