"""Hostile generate bodies through the in-process mirror (issue 26): what a client can make the
mirror's JSON work cost is bounded, and the client still gets the incumbent's answer.

Found by a review done as an attacker would: an 8 MiB body of ``"metadata":[{},{},...]`` took
the mirror from 192 to 743 MiB and delayed other clients by 23.7 s; ~520k distinct e-mail-like
strings stalled the loop 14.4 s (the redactor); a body nested 990 deep made credential
stripping raise RecursionError, and the client got a 500 from the mirror while the incumbent
never saw the request. Each such body now goes to the incumbent unchanged and unshadowed,
counted (``skipped_hostile``, ``shadow_ab_mirror_bodies_refused_total{reason}``), never a 500,
and nothing private reaches a log.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import tracemalloc

import orjson
import pytest
from aiohttp import web
from mirror_helpers import (
    MODEL,
    ListSink,
    StandInEngine,
    chat_answer,
    decisions,
    served_in_process,
)
from prometheus_client import REGISTRY

from mirror.app import Mirror
from mirror.config import load_settings
from shadow_ab.records import ExchangeRecord, Role, Status

SECRET = "sk-hostile-client-secret-0123456789"
PROMPT = "a private prompt that must not reach a log"
ANSWER = orjson.dumps(chat_answer("ok"))


class Engine(StandInEngine):
    """Answers every chat with a fixed completion; keeps the bodies it was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[bytes] = []
        self.lock = threading.Lock()

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._answer)

    async def _answer(self, request: web.Request) -> web.Response:
        body = await request.content.read()  # not request.read(): no 1 MiB client_max_size
        with self.lock:
            self.bodies.append(body)
        return web.Response(body=ANSWER, content_type="application/json")


def _start(extra: bytes) -> bytes:
    messages = orjson.dumps([{"role": "user", "content": PROMPT}])
    return b'{"model":"' + MODEL.encode() + b'","messages":' + messages + b"," + extra + b"}"


def tiny_elements() -> bytes:
    """Just under 8 MiB of ``{},`` (2.7 M objects)."""
    return _start(b'"metadata":[' + b",".join([b"{}"] * 2_700_000) + b"]")


def email_strings() -> bytes:
    """520,000 distinct e-mail-like strings (the redactor's worst case)."""
    items = b",".join(b'"u%d@e.co"' % i for i in range(520_000))
    return _start(b'"metadata":[' + items + b"]")


def nested(depth: int) -> bytes:
    return _start(b'"metadata":' + b"[" * depth + b"]" * depth)


def refused(reason: str) -> float:
    labels = {"reason": reason}
    return REGISTRY.get_sample_value("shadow_ab_mirror_bodies_refused_total", labels) or 0.0


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (tiny_elements, "too_many_containers"),
        (email_strings, "too_many_strings"),
        (lambda: nested(990), "too_deep"),
    ],
    ids=["8MiB-of-empty-objects", "520k-emails", "nested-990"],
)
def test_a_hostile_body_reaches_the_incumbent_unchanged_unshadowed_and_costs_little(
    make: object, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    body = make()  # type: ignore[operator]
    assert len(body) < 8 * 1024 * 1024
    caplog.set_level(logging.DEBUG)
    before, refused_before = decisions(), refused(reason)
    with Engine() as inc, Engine() as cand:
        s = load_settings(
            None,
            incumbent={"url": inc.url},
            candidate={"url": cand.url},
            shadow={"rate": 1.0, "replay_rate": 1.0, "replay_delay_s": 0.0},
            health_enabled=False,
            database_url="sqlite:///unused.db",
            privacy={"capture": "full"},
        )
        sink = ListSink()
        headers = {
            "content-type": "application/json",
            "authorization": f"Bearer {SECRET}",
            "x-shadow-capture": "none",
        }

        async def main() -> tuple[int, bytes, int]:
            mirror = Mirror(s, sink=sink)
            async with served_in_process(mirror) as client:
                tracemalloc.start()
                try:
                    resp = await client.post("/v1/chat/completions", content=body, headers=headers)
                    peak = tracemalloc.get_traced_memory()[1]
                finally:
                    tracemalloc.stop()
                return resp.status_code, resp.content, peak

        status, answer, peak = asyncio.run(main())
        inc_bodies, cand_bodies = list(inc.bodies), list(cand.bodies)

    assert status == 200 and answer == ANSWER  # the incumbent's answer, not the mirror's 500
    assert inc_bodies == [body]  # unchanged (no include_usage rewrite of an unparsed body)
    assert cand_bodies == []  # not shadowed, not replayed
    after = decisions()
    assert after.get("skipped_hostile", 0) - before.get("skipped_hostile", 0) == 1
    assert after.get("sampled", 0) == before.get("sampled", 0)
    assert refused(reason) == refused_before + 1
    records = [r for r in sink.records if isinstance(r, ExchangeRecord)]
    assert [(r.role, r.status) for r in records] == [(Role.INCUMBENT, Status.OK)]
    assert records[0].request == {}  # nothing of the body parsed into the record
    # The client sends the body, the engine and the mirror hold a copy each: a few times its
    # size, where parsing it built hundreds of MiB (2.7 M dicts: ~550 MiB).
    bound = 8 * len(body) + (32 << 20)
    assert peak < bound, f"{peak / 2**20:.0f} MiB traced for a {len(body) / 2**20:.1f} MiB body"
    logged = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    assert SECRET not in logged and PROMPT not in logged
