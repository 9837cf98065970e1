"""``data_plane: native`` (mirror/front.py, front/): the generate routes' bytes in the compiled
front, the shadow side in the mirror's Python process.

What only this plane promises: the client is served while the Python process is stopped
outright (its records follow when it runs again); a front that dies is started again and the
exchanges it had in flight are settled, not lost silently; a missing front is a clear error.
Everything the other planes promise is checked on this one by running the mirror's tests with
``SHADOW_AB_DEV_DATA_PLANE=native`` (mirror/README.md, "The native front")."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import orjson
import pytest
from mirror_helpers import MODEL, pair_key, rows, wait_rows

from mirror.front import BINARY, BINARY_ENV, front_binary
from shadow_ab.dev.processes import RunningMirror, RunningSim, running_mirror


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(c) for c in f.read().split()]
    return out


def front_pid(mirror: RunningMirror) -> int:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for c in children(mirror.pid):
            with contextlib.suppress(OSError), open(f"/proc/{c}/cmdline", "rb") as f:
                if Path(f.read().split(b"\0")[0].decode()).name == BINARY:
                    return c
        time.sleep(0.05)
    raise AssertionError(f"no {BINARY} child of the mirror (pid {mirror.pid})")


def stream_chat(port: int, content: str) -> tuple[str, str]:
    """One streamed chat through the mirror: (pair id, the whole body)."""
    with (
        httpx.Client(timeout=30.0) as http,
        http.stream(
            "POST",
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": 6,
                "temperature": 0,
                "stream": True,
            },
        ) as resp,
    ):
        assert resp.status_code == 200
        body = resp.read().decode()
        return resp.headers["x-shadow-pair-id"], body


@pytest.fixture()
def native(
    engines: tuple[RunningSim, RunningSim], tmp_path: Path
) -> Iterator[tuple[RunningMirror, str]]:
    inc, cand = engines
    db = f"sqlite:///{tmp_path / 'records.db'}"
    with running_mirror(
        inc.base_url, cand.base_url, data_plane="native", database_url=db, deployment="front"
    ) as mirror:
        yield mirror, db


def test_the_binary_is_built() -> None:
    # `make test` builds it (`make front`); the rest of this file needs it.
    assert front_binary().name == BINARY


def test_clients_are_served_while_the_shadow_side_is_stopped(
    native: tuple[RunningMirror, str],
) -> None:
    mirror, db = native
    front_pid(mirror)  # the front is up
    stream_chat(mirror.port, "warm")
    os.kill(mirror.pid, signal.SIGSTOP)
    try:
        answered = [stream_chat(mirror.port, f"while stopped {i}") for i in range(4)]
    finally:
        os.kill(mirror.pid, signal.SIGCONT)
    for _, body in answered:
        assert body.rstrip().endswith("data: [DONE]")
        assert '"usage"' not in body  # the usage event the front asked for is hidden
    for pair, _ in answered:
        got = {
            r["role"]: r
            for r in wait_rows(db, 2, "pair_id = :p", timeout=30.0, p=pair_key(pair, db))
        }
        assert got["incumbent"]["status"] == "ok" and got["candidate"]["status"] == "ok"
        assert got["incumbent"]["ttft_s"] is not None
        assert got["incumbent"]["completion_tokens"] == 6


def test_a_killed_front_is_started_again(native: tuple[RunningMirror, str]) -> None:
    mirror, _ = native
    first = front_pid(mirror)
    # front.shadow_nice (10): the shadow side yields a core to the client's bytes
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert os.getpriority(os.PRIO_PROCESS, first) == base
    deadline = time.monotonic() + 10
    while os.getpriority(os.PRIO_PROCESS, mirror.pid) != min(19, base + 10):
        assert time.monotonic() < deadline, "the mirror's process never took niceness 10"
        time.sleep(0.05)
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and front_pid(mirror) == first:
        time.sleep(0.05)
    assert front_pid(mirror) != first
    assert os.getpriority(os.PRIO_PROCESS, front_pid(mirror)) == base  # reset in the child
    pair, body = stream_chat(mirror.port, "after a restart")
    assert pair and body.rstrip().endswith("data: [DONE]")
    assert mirror.metric("shadow_ab_mirror_front_restarts_total") == 1


def test_without_the_binary_the_mirror_says_how_to_build_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-front"
    cfg = tmp_path / "m.yaml"
    cfg.write_text(
        "incumbent: {url: 'http://127.0.0.1:1'}\ncandidate: {url: 'http://127.0.0.1:2'}\n"
        "data_plane: native\nport: 0\nadmin_port: 0\n"
    )
    db = f"sqlite:///{tmp_path / 'r.db'}"
    done = subprocess.run(
        [sys.executable, "-m", "shadow_ab", "mirror", "--config", str(cfg), "--database-url", db],
        env={**os.environ, BINARY_ENV: str(missing), "SHADOW_AB_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "make front" in done.stderr and str(missing) in done.stderr


# -- the tee's frames, in process (the mirror's side alone, records to a real SQLite store) ---


def frame(**fields: object) -> bytes:
    """A frame as the front writes it: byte strings in base64."""
    return msgspec.json.encode(fields)


def test_tee_frames_become_records_and_bad_ones_are_counted_not_fatal(tmp_path: Path) -> None:
    from mirror import metrics as m
    from mirror.app import create_app
    from mirror.config import load_settings
    from mirror.front import Tee
    from mirror.sinks import open_sink

    db = f"sqlite:///{tmp_path / 'r.db'}"
    settings = load_settings(
        None,
        incumbent={"url": "http://127.0.0.1:9"},
        candidate={"url": "http://127.0.0.1:10"},
        shadow={"rate": 0.0},
        deployment="tee",
    )
    sink = open_sink(kafka=None, database_url=db, direct_queue_max_bytes=1 << 20)
    mirror = create_app(settings, sink=sink)
    lost = {
        r: m.FRONT_FRAMES_LOST.labels(reason=r)._value.get()
        for r in ("malformed", "unmatched", "front_queue", "abandoned")
    }
    pair, pair2 = str(uuid.uuid4()), str(uuid.uuid4())
    body = orjson.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True}
    )
    sse = (
        b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
        b'"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
    )
    done = (
        b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
        b'"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    )

    async def feed() -> None:
        tee = Tee(mirror)
        common = {
            "route": "/v1/chat/completions",
            "path": "/v1/chat/completions",
            "wall": time.time(),
        }
        tee.frame(
            frame(
                k="req",
                id=1,
                pair=pair,
                headers=[["content-type", "application/json"]],
                body=body,
                dropped=3,
                **common,
            )
        )
        tee.frame(b'{"k": "req", "id": ')  # cut short
        tee.frame(frame(k="what", id=9))  # not a kind of frame
        tee.frame(frame(k="end", id=77, status="ok", client_code=200))  # no such request
        tee.frame(
            frame(
                k="end",
                id=1,
                status="ok",
                http_status=200,
                client_code=200,
                sse=True,
                chunks=[[0.04, sse], [0.05, done]],
                parts=[],
                last_t=0.05,
                added_s=0.0002,
            )
        )
        tee.frame(frame(k="req", id=2, pair=pair2, headers=[], body=body, **common))
        assert tee.abandon("the front exited") == 1  # id 2's end never comes
        assert not tee.pending

    asyncio.run(feed())
    assert sink.close(10)
    got = {(uuid.UUID(str(r["pair_id"])), r["status"]): r for r in rows(db, "role = 'incumbent'")}
    ok = got[(uuid.UUID(pair), "ok")]
    assert ok["ttft_s"] == pytest.approx(0.04) and ok["e2e_s"] == pytest.approx(0.05)
    assert ok["output_text"] == "hi" and ok["finish_reason"] == "stop"
    assert got[(uuid.UUID(pair2), "connection_error")]["error"] == "the front exited"
    now = {r: m.FRONT_FRAMES_LOST.labels(reason=r)._value.get() for r in lost}
    assert {r: now[r] - lost[r] for r in lost} == {
        "malformed": 2,
        "unmatched": 1,
        "front_queue": 3,
        "abandoned": 1,
    }


def test_tee_framing_survives_any_split_and_refuses_a_giant_frame() -> None:
    from mirror.front import FRAME_MAX, _TeeConnection

    class Frames:
        def __init__(self) -> None:
            self.got: list[bytes] = []
            self.lost = 0

        def frame(self, raw: bytes) -> None:
            self.got.append(raw)

        def _lost(self, reason: str) -> None:
            self.lost += 1

        connections = 0

    payloads = [b'{"k":"req"}', b"", b"x" * 300]
    stream = b"".join(len(p).to_bytes(4, "big") + p for p in payloads)
    for size in (1, 3, 7, len(stream)):
        frames = Frames()
        conn = _TeeConnection(frames)  # type: ignore[arg-type]
        for i in range(0, len(stream), size):
            conn.data_received(stream[i : i + size])
        assert frames.got == payloads and not conn.buf

    class Transport:
        closed = False

        def close(self) -> None:
            self.closed = True

    frames = Frames()
    conn = _TeeConnection(frames)  # type: ignore[arg-type]
    transport = Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.data_received((FRAME_MAX + 1).to_bytes(4, "big") + b"{}")
    assert transport.closed and frames.lost == 1 and not frames.got
