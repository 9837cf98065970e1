"""Issue 14, finding 2: a full disk under the spool is back-pressure, not the end of the sink.

The disk is a real tmpfs of a few KiB when this process may mount one (root), and an injected
``OSError(ENOSPC)`` after a short write otherwise; both paths run the same assertions.
"""

from __future__ import annotations

import builtins
import errno
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from factories import numbered_exchange
from fastapi.testclient import TestClient

from mirror import kafka_sink as ks
from mirror import spool as spool_module
from mirror.app import Mirror
from mirror.config import load_settings
from mirror.kafka_sink import KafkaSink, KafkaSinkConfig, encode_frame
from mirror.spool import Spool
from shadow_ab.dev.processes import free_port

DEP = "sink-faults"


def _frame(i: int) -> bytes:
    rec = numbered_exchange(DEP, i)
    return encode_frame("t.exchanges", str(rec.pair_id).encode(), rec.to_json())


class Disk:
    """The spool's files on a disk with ``room`` bytes left (for when no tmpfs can be
    mounted): a write that does not fit writes part of its bytes, then fails with ENOSPC."""

    def __init__(self, room: int) -> None:
        self.room = room

    def open(self, path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = builtins.open(path, mode, *args, **kwargs)  # noqa: SIM115
        return DiskFile(f, self) if ("a" in mode or "w" in mode) else f


class DiskFile:
    def __init__(self, inner: Any, disk: Disk) -> None:
        self.inner = inner
        self.disk = disk

    def write(self, data: bytes) -> int:
        if len(data) <= self.disk.room:
            self.disk.room -= len(data)
            return int(self.inner.write(data))
        self.inner.write(data[: max(0, self.disk.room)])
        self.disk.room = 0
        self.inner.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __enter__(self) -> DiskFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.inner.close()


@pytest.fixture(params=["tmpfs", "injected"])
def small_disk(request: pytest.FixtureRequest) -> Iterator[Path | None]:
    """A 16 KiB tmpfs; None for "injected", or when no tmpfs can be mounted: the test then
    injects ENOSPC after a short write."""
    root = Path(tempfile.mkdtemp(prefix="shadow-ab-small-disk-"))
    mounted = (
        request.param == "tmpfs"
        and os.geteuid() == 0
        and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(root)],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )
    try:
        yield root if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", str(root)], check=False)
        root.rmdir()


@pytest.fixture
def disk(small_disk: Path | None, monkeypatch: pytest.MonkeyPatch) -> Disk | None:
    """The injected disk when there is no tmpfs (the spool's files are opened on it)."""
    if small_disk is not None:
        return None
    injected = Disk(room=10**9)
    monkeypatch.setattr(spool_module, "open", injected.open, raising=False)
    return injected


def _fill(spool: Spool, disk: Disk | None, start: int) -> int:
    """Append until the disk refuses; the number of entries that went in."""
    if disk is not None:
        disk.room = 6 * len(_frame(0)) + 10
    n = 0
    while spool.append(_frame(start + n)):
        n += 1
        assert n < 10_000, "the disk never filled"
    return n


def test_a_full_disk_refuses_entries_cleanly_and_takes_them_again_once_space_is_back(
    small_disk: Path | None, disk: Disk | None, tmp_path: Path
) -> None:
    folder = (small_disk or tmp_path) / "spool"
    spool = Spool(folder, max_bytes=10**9, publish_metrics=False)
    went_in = _fill(spool, disk, 0)
    assert went_in > 0
    assert spool.write_errors == 1 and spool.dropped == 1
    assert not spool.append(_frame(999))  # still full: refused again, nothing torn
    assert len(spool) == went_in
    # Space comes back: the delivered entries are acked (their segment is deleted).
    for entry in spool.read(went_in):
        spool.ack(entry.id)
    if disk is not None:
        disk.room = 10**9
    assert len(spool) == 0
    assert spool.append(_frame(1000)) and spool.append(_frame(1001))
    spool.close()
    # Every entry on disk is whole: nothing was cut when it is opened again.
    with Spool(folder, max_bytes=10**9, publish_metrics=False) as again:
        assert again.corrupt_bytes == 0
        assert [e.payload for e in again.read(10)] == [_frame(1000), _frame(1001)]


def test_the_kafka_sink_survives_a_full_disk_counts_spool_full_and_recovers(
    small_disk: Path | None, disk: Disk | None, tmp_path: Path
) -> None:
    """Kafka away, the spool's disk full: records are dropped as spool_full (counted), the
    sink's thread lives on, and once space is back new records are spooled again."""
    folder = (small_disk or tmp_path) / "spool"
    cfg = KafkaSinkConfig(bootstrap=f"127.0.0.1:{free_port()}", spool_dir=folder)
    sink = KafkaSink(cfg, retry_backoff_s=60)
    filler = (small_disk or tmp_path) / "filler"
    if disk is not None:
        disk.room = 4 * len(_frame(0))
    else:
        filler.write_bytes(b"\0" * 8 * 1024)  # leaves room for a few records
    try:
        _full_disk_then_space_back(sink, disk, filler)
    finally:
        sink.close(10)


def _settled(sink: KafkaSink, n: int) -> Any:
    """The sink's stats once ``n`` records were spooled or dropped."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stats = sink.stats()
        if stats.spooled + sum(stats.dropped.values()) >= n:
            return stats
        time.sleep(0.02)
    raise AssertionError(f"records not settled: {sink.stats()}")


def _full_disk_then_space_back(sink: KafkaSink, disk: Disk | None, filler: Path) -> None:
    for i in range(60):
        assert sink.submit(numbered_exchange(DEP, i))
    stats = _settled(sink, 60)
    assert stats.dropped["spool_full"] > 0
    assert stats.spooled + stats.dropped["spool_full"] == 60
    assert sink.alive()
    spooled_first = stats.spooled

    filler.unlink(missing_ok=True)  # space comes back
    if disk is not None:
        disk.room = 10**9
    else:
        for entry in sink.spool.read(spooled_first):  # the delivered ones leave the disk
            sink.spool.ack(entry.id)
        sink.spool.rewind()
    for i in range(60, 70):
        assert sink.submit(numbered_exchange(DEP, i))
    stats = _settled(sink, 70)
    assert stats.spooled - spooled_first == 10, "records were dropped after space came back"
    assert sink.alive()
    assert not sink.close(10)  # records were dropped: close() says so


def test_a_sink_thread_that_keeps_failing_dies_and_healthz_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ks, "MAX_STEP_FAILURES", 3)

    def no_broker(_cfg: KafkaSinkConfig) -> Any:
        raise ConnectionError("no broker here")

    sink = KafkaSink(
        KafkaSinkConfig(bootstrap="x:1", spool_dir=tmp_path / "spool"),
        producer_factory=no_broker,
        poll_s=0.01,
    )
    settings = load_settings(
        None, incumbent={"url": "http://127.0.0.1:9"}, candidate={"url": "http://127.0.0.1:10"}
    )
    mirror = Mirror(settings, sink=sink)
    mirror.started = True  # not started: the admin app's /healthz alone
    client = TestClient(mirror.admin)
    assert client.get("/healthz").status_code == 200

    def broken(*_a: Any) -> None:
        raise RuntimeError("a bug the sink trips over on every round")

    monkeypatch.setattr(sink, "_check_stuck", broken)
    assert sink.submit(numbered_exchange(DEP, 0))
    deadline = time.monotonic() + 30
    while sink.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not sink.alive()
    answer = client.get("/healthz")
    assert answer.status_code == 503 and answer.json()["sink"] == "dead"
    sink.close(1)


def test_one_failing_round_does_not_end_the_sink_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_broker(_cfg: KafkaSinkConfig) -> Any:
        raise ConnectionError("no broker here")

    sink = KafkaSink(
        KafkaSinkConfig(bootstrap="x:1", spool_dir=tmp_path / "spool"),
        producer_factory=no_broker,
        poll_s=0.01,
    )
    real = sink._check_stuck
    failures = iter([True, True])

    def once_broken() -> None:
        if next(failures, False):
            raise RuntimeError("a passing fault")
        real()

    monkeypatch.setattr(sink, "_check_stuck", once_broken)
    for i in range(5):
        assert sink.submit(numbered_exchange(DEP, i))
    assert not sink.flush(10)
    assert sink.alive()
    assert sink.close(5)  # Kafka away, everything spooled, nothing lost
    assert sink.stats().spooled == 5
