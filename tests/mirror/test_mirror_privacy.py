"""What leaves the mirror, and to whom (issue 14, findings 8-10): the candidate gets no client
credential, no URL password reaches a client, a log or a record, and records keep only the text
their capture level allows, redacted.

Engines here are small recording servers (what each engine was sent is the evidence) or the
simulator pair; the mirror runs in-process with a list sink, or as a real subprocess where the
server's own parsing matters (``OPTIONS *``)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import socket
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web
from mirror_helpers import MODEL, ListSink, served_in_process

from evaluator.compare import PairSide, compare_pair, side_margin
from mirror import metrics as m
from mirror.app import Mirror
from mirror.config import MirrorConfigError, MirrorSettings, load_settings
from mirror.privacy import Privacy, PrivacyConfig
from mirror.spool import CURSOR_FILE, Spool
from shadow_ab.dev.processes import RunningSim, free_port, running_mirror
from shadow_ab.privacy import is_digest
from shadow_ab.records import ExchangeRecord, Role, Status, TokenLogprob
from storage.db import make_engine

CLIENT_SECRETS = {
    "authorization": "Bearer sk-client-secret-1",
    "cookie": "session=client-cookie-2",
    "api-key": "client-api-key-3",
    "x-api-key": "client-x-api-key-4",
}
ANSWER = "Hello from the engine, write to jane@example.com"


@dataclass
class Recorder:
    """A tiny OpenAI-style engine that keeps what it was sent."""

    answer: str = ANSWER
    status: int = 200
    seen: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        self.seen.append(({k.lower(): v for k, v in request.headers.items()}, body))
        if self.status != 200:
            error = {
                "object": "error",
                "message": f"bad request for prompt {body.get('messages')!r}",
                "type": "BadRequestError",
                "param": None,
                "code": self.status,
            }
            return web.json_response(error, status=self.status)
        answer = {
            "id": "x",
            "object": "chat.completion",
            "model": body.get("model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": self.answer},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14},
        }
        return web.json_response(answer)


@contextlib.asynccontextmanager
async def serving(rec: Recorder) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", rec.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def chat(**extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Where is Paris? Mail me at bob@example.org"}],
        "max_tokens": 6,
        "temperature": 0,
        **extra,
    }


async def through(
    s: MirrorSettings, requests: list[tuple[dict[str, Any], dict[str, str]]], sink: ListSink
) -> list[httpx.Response]:
    mirror = Mirror(s, sink=sink)
    async with served_in_process(mirror) as client:
        return [await client.post("/v1/chat/completions", json=b, headers=h) for b, h in requests]


def run_with_engines(
    inc: Recorder,
    cand: Recorder,
    requests: list[tuple[dict[str, Any], dict[str, str]]],
    **over: Any,
) -> tuple[list[httpx.Response], list[ExchangeRecord]]:
    sink = ListSink()

    async def main() -> list[httpx.Response]:
        async with serving(inc) as inc_url, serving(cand) as cand_url:
            cand_over = over.pop("candidate", {})
            s = load_settings(
                None,
                incumbent={"url": inc_url, "include_usage": False},
                candidate={"url": cand_url, **cand_over},
                health_enabled=False,
                database_url="sqlite:///unused.db",
                **over,
            )
            return await through(s, requests, sink)

    responses = asyncio.run(main())
    return responses, [r for r in sink.records if isinstance(r, ExchangeRecord)]


def roles(records: list[ExchangeRecord]) -> dict[Role, ExchangeRecord]:
    return {r.role: r for r in records}


# -- finding 8: the candidate gets no client credentials -------------------------------------------


def test_candidate_gets_only_allowed_headers_and_its_own_credentials(tmp_path: Path) -> None:
    key_file = tmp_path / "candidate-key"
    key_file.write_text("Bearer candidate-own-key\n")
    os.environ["TEST_CANDIDATE_ORG"] = "candidate-org"
    try:
        inc, cand = Recorder(), Recorder()
        body = chat(api_key="sk-body-secret-5", metadata={"api_key": "sk-nested-6", "team": "a"})
        headers = {**CLIENT_SECRETS, "x-custom": "kept-for-incumbent", "x-trace": "t-1"}
        responses, records = run_with_engines(
            inc,
            cand,
            [(body, headers)],
            candidate={
                "headers": {
                    "Authorization": {"file": str(key_file)},
                    "openai-organization": {"env": "TEST_CANDIDATE_ORG"},
                },
                "forward_headers": ["content-type", "accept", "x-trace"],
            },
        )
    finally:
        del os.environ["TEST_CANDIDATE_ORG"]
    assert responses[0].status_code == 200
    (inc_headers, inc_body), (cand_headers, cand_body) = inc.seen[0], cand.seen[0]

    # The incumbent, which may check the client's key, gets the client's request as it was.
    assert inc_headers["authorization"] == CLIENT_SECRETS["authorization"]
    assert inc_headers["x-custom"] == "kept-for-incumbent"
    assert inc_body["api_key"] == "sk-body-secret-5"

    # The candidate: its own credentials, the allow-listed headers, nothing else of the client's.
    assert cand_headers["authorization"] == "Bearer candidate-own-key"
    assert cand_headers["openai-organization"] == "candidate-org"
    assert cand_headers["x-trace"] == "t-1"
    assert cand_headers["x-shadow-pair-id"] == inc_headers["x-shadow-pair-id"]
    for name in ("cookie", "api-key", "x-api-key", "x-custom"):
        assert name not in cand_headers, name
    assert "api_key" not in cand_body and cand_body["metadata"] == {"team": "a"}
    assert cand_body["messages"] == body["messages"]

    recs = roles(records)
    assert recs[Role.CANDIDATE].rewrites[:2] == [
        "credential:api_key",
        "credential:metadata.api_key",
    ]
    dump = repr([r.model_dump() for r in records])
    for secret in [*CLIENT_SECRETS.values(), "sk-body-secret-5", "sk-nested-6"]:
        assert secret.split()[-1] not in dump, secret


def test_candidate_without_configured_credentials_gets_none() -> None:
    inc, cand = Recorder(), Recorder()
    run_with_engines(inc, cand, [(chat(), {**CLIENT_SECRETS, "user-agent": "sdk/1"})])
    cand_headers, _ = cand.seen[0]
    assert not set(CLIENT_SECRETS) & set(cand_headers)
    assert cand_headers["user-agent"] == "sdk/1"  # on the default allow-list


def test_forwarding_a_credential_header_is_refused() -> None:
    with pytest.raises(MirrorConfigError, match=r"authorization.*never sent to the candidate"):
        load_settings(
            None,
            incumbent={"url": "http://127.0.0.1:1"},
            candidate={"url": "http://127.0.0.1:2", "forward_headers": ["Authorization"]},
        )
    with pytest.raises(MirrorConfigError, match="TEST_NOT_SET_ANYWHERE is not set"):
        load_settings(
            None,
            incumbent={"url": "http://127.0.0.1:1"},
            candidate={
                "url": "http://127.0.0.1:2",
                "headers": {"authorization": {"env": "TEST_NOT_SET_ANYWHERE"}},
            },
        )
    with pytest.raises(MirrorConfigError, match="give one of env"):
        load_settings(
            None,
            incumbent={"url": "http://127.0.0.1:1"},
            candidate={
                "url": "http://127.0.0.1:2",
                "headers": {"x-key": {"env": "A", "file": "b"}},
            },
        )


def test_the_incumbent_urls_credentials_go_only_on_the_mirrors_own_requests() -> None:
    """``http://user:password@incumbent``: the mirror's own requests to the incumbent (a probe,
    the model lookup) carry them as Basic credentials; a client's chat, its replay and a
    pass-through ``GET /v1/models`` carry only what the client sent (issue 26: they were added to
    every client request without an ``Authorization``). A candidate URL's credentials are the
    mirror's own for the candidate: on every candidate request."""
    from mirror.probes import ProbeInjector

    inc, cand = Recorder(), Recorder()
    models: list[dict[str, str]] = []

    async def list_models(request: web.Request) -> web.Response:
        models.append({k.lower(): v for k, v in request.headers.items()})
        return web.json_response({"object": "list", "data": [{"id": MODEL}]})

    async def main() -> tuple[list[int], str | None]:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", inc.handle)
        app.router.add_get("/v1/models", list_models)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with serving(cand) as cand_url:
                s = load_settings(
                    None,
                    incumbent={"url": f"http://inc-user:inc-pass@127.0.0.1:{port}"},
                    candidate={"url": cand_url.replace("http://", "http://cand-user:cand-pass@")},
                    shadow={"rate": 1.0, "replay_rate": 1.0, "replay_delay_s": 0.0},
                    health_enabled=False,
                    database_url="sqlite:///unused.db",
                )
                mirror = Mirror(s, sink=ListSink())
                async with served_in_process(mirror) as client:
                    codes = [(await client.post("/v1/chat/completions", json=chat())).status_code]
                    codes.append((await client.get("/v1/models")).status_code)
                    probes = ProbeInjector(mirror.core, s.probes, mirror.passthrough.session)
                    model = await probes.model_name()
                    await asyncio.gather(*probes.tick(model))
                return codes, model
        finally:
            await runner.cleanup()

    codes, model = asyncio.run(main())
    assert codes == [200, 200] and model == MODEL
    basic = "Basic " + base64.b64encode(b"inc-user:inc-pass").decode()
    inc_auth = [headers.get("authorization") for headers, _ in inc.seen]
    # the client's chat and its replay without, the probe with
    assert sorted(inc_auth, key=str) == sorted([None, None, basic], key=str)
    assert [m.get("authorization") for m in models] == [None, basic]  # the client's, the lookup
    cand_basic = "Basic " + base64.b64encode(b"cand-user:cand-pass").decode()
    assert [h.get("authorization") for h, _ in cand.seen] == [cand_basic, cand_basic]


# -- finding 9: URL passwords ----------------------------------------------------------------------


def test_url_password_reaches_no_client_record_log_or_metric(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inc_url = f"http://user:INC-PASSWORD@127.0.0.1:{free_port()}"
    cand_url = f"http://user:CAND-PASSWORD@127.0.0.1:{free_port()}"
    s = load_settings(
        None,
        incumbent={"url": inc_url},
        candidate={"url": cand_url},
        health_enabled=False,
        database_url="sqlite:///unused.db",
    )
    sink = ListSink()

    async def main() -> list[httpx.Response]:
        mirror = Mirror(s, sink=sink)
        async with served_in_process(mirror) as client:
            out = [await client.post("/v1/chat/completions", json=chat())]
            out.append(await client.get("/v1/models"))
            # The admin endpoints are the admin port's (mirror.admin).
            admin = httpx.ASGITransport(app=mirror.admin)
            async with httpx.AsyncClient(transport=admin, base_url="http://m") as admin_client:
                out.append(await admin_client.get("/healthz"))
                out.append(await admin_client.get("/metrics"))
        return out

    with caplog.at_level("INFO"):
        responses = asyncio.run(main())
    assert [r.status_code for r in responses] == [502, 502, 200, 200]
    records = [r for r in sink.records if isinstance(r, ExchangeRecord)]
    assert {r.status for r in records} == {Status.CONNECTION_ERROR}
    everything = (
        b"".join(r.content for r in responses).decode()
        + caplog.text
        + repr([r.model_dump() for r in records])
    )
    assert "INC-PASSWORD" not in everything and "CAND-PASSWORD" not in everything
    assert "user:***@127.0.0.1" in caplog.text  # the start-up line names the engines


def test_options_star_shows_no_password(engines: tuple[RunningSim, RunningSim]) -> None:
    """The reproduction of finding 9: ``OPTIONS *`` made the URL invalid, and aiohttp's error
    (the whole URL, password included) went to the client in a 502 and to the log."""
    inc, cand = engines
    host_port = inc.base_url.split("://", 1)[1]
    with running_mirror(
        f"http://user:PASSWORD-9@{host_port}", cand.base_url, health_enabled=False
    ) as mirror:
        with socket.create_connection((mirror.host, mirror.port), timeout=10) as sock:
            sock.sendall(b"OPTIONS * HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        healthz = httpx.get(mirror.admin_url + "/healthz").text
        metrics = mirror.metrics_text()
        mirror.stop()
        log = mirror.log_path.read_text()
    assert answer.startswith(b"HTTP/1.1 ")
    for text in (answer.decode("latin-1"), healthz, metrics, log):
        assert "PASSWORD-9" not in text
    assert "user:***@" in log  # the start-up line, redacted


# -- finding 10: capture levels, the opt-out header, the redactor ----------------------------------


def test_full_capture_redacts_nested_request_output_and_error() -> None:
    inc, cand = Recorder(), Recorder(status=400)
    body = chat(user="carol@example.net", metadata={"phone": "+1 415 555 2671"})
    _, records = run_with_engines(inc, cand, [(body, {})])
    recs = roles(records)
    i, c = recs[Role.INCUMBENT], recs[Role.CANDIDATE]
    assert i.request["messages"][0]["content"] == "Where is Paris? Mail me at [EMAIL]"
    assert i.request["user"] == "[EMAIL]" and i.request["metadata"] == {"phone": "[PHONE]"}
    assert i.output_text == "Hello from the engine, write to [EMAIL]"
    assert c.status is Status.HTTP_ERROR and c.error is not None
    assert "bob@example.org" not in c.error and "[EMAIL]" in c.error  # the engine echoed it
    assert i.rewrites == [] and not any(r.startswith("capture:") for r in c.rewrites)


def test_custom_redactor_and_a_failing_one(caplog: pytest.LogCaptureFixture) -> None:
    _, records = run_with_engines(
        Recorder(), Recorder(), [(chat(), {})], privacy={"redactor": "privacy_redactors:mark"}
    )
    assert all("[CITY]" in r.request["messages"][0]["content"] for r in records)
    assert all("jane@example.com" in (r.output_text or "") for r in records)  # builtin replaced

    before = m.RECORDS_DROPPED.labels(reason="redactor_error")._value.get()
    responses, records = run_with_engines(
        Recorder(), Recorder(), [(chat(), {})], privacy={"redactor": "privacy_redactors:broken"}
    )
    assert responses[0].status_code == 200  # the client is served all the same
    assert records == []  # nothing unredacted leaves the mirror
    assert "the redactor failed" in caplog.text and "Paris" not in caplog.text
    after = m.RECORDS_DROPPED.labels(reason="redactor_error")._value.get()
    assert after - before == 2


def test_metadata_capture_keeps_no_text_and_pairs_still_compare(
    engines: tuple[RunningSim, RunningSim], tmp_path: Path
) -> None:
    inc, cand = engines
    key = tmp_path / "hash-key"
    key.write_text("deployment-key\n")
    s = load_settings(
        None,
        incumbent={"url": inc.base_url},
        candidate={"url": cand.base_url},
        health_enabled=False,
        database_url="sqlite:///unused.db",
        privacy={"capture": "metadata", "hash_key_file": str(key)},
    )
    sink = ListSink()
    body = chat(stream=True, logprobs=True, top_logprobs=2, user="dave@example.com")
    asyncio.run(through(s, [(body, {})], sink))
    recs = roles([r for r in sink.records if isinstance(r, ExchangeRecord)])
    i, c = recs[Role.INCUMBENT], recs[Role.CANDIDATE]
    for r in (i, c):
        assert r.status is Status.OK and r.completion_tokens and r.ttft_s is not None
        assert is_digest(r.output_text) and is_digest(r.request["messages"])
        assert is_digest(r.request["user"])
        assert r.request["temperature"] == 0 and r.request["max_tokens"] == 6
        assert r.rewrites[-1] == "capture:metadata"
        assert r.logprobs and all(lp.token.startswith("h:") for lp in r.logprobs)
        dump = repr(r.model_dump())
        assert "Paris" not in dump and "dave@" not in dump
    assert i.request["messages"] == c.request["messages"]  # same prompt, same digest: pairing
    d = compare_pair(PairSide.from_record(i), PairSide.from_record(c))
    assert d.comparable and d.exact_match is True and d.first_divergence is None
    assert d.token_basis == "logprobs" and d.edit_similarity == 1.0


def test_divergence_from_digests_alone() -> None:
    privacy = Privacy(PrivacyConfig(capture="metadata"))

    def side(text: str, tokens: list[str] | None) -> PairSide:
        logprobs = (
            [TokenLogprob(token=t, logprob=-0.1, top={t: -0.1}) for t in tokens] if tokens else None
        )
        rec = _record(text, logprobs, completion_tokens=len(text.split()))
        return PairSide.from_record(privacy.apply(rec, "metadata"))

    same = compare_pair(side("a b c", None), side("a b c", None))
    assert same.comparable and same.exact_match is True and same.token_basis == "digest"
    differ = compare_pair(side("a b c", None), side("a b d", None))
    assert differ.diverged and differ.exact_match is False and differ.edit_similarity is None
    tokens = compare_pair(side("a b c", ["a", "b", "c"]), side("a x c", ["a", "x", "c"]))
    assert tokens.diverged and tokens.first_divergence == 1
    assert tokens.edit_similarity == pytest.approx(2 / 3)
    # a digest against a text (two capture levels) is no comparison at all
    plain = PairSide(text="a b c", request={"temperature": 0})
    assert not compare_pair(side("a b c", None), plain).comparable


def _record(
    text: str, logprobs: list[TokenLogprob] | None, completion_tokens: int | None = None
) -> ExchangeRecord:
    return ExchangeRecord.model_validate(
        {
            "deployment": "d",
            "pair_id": "00000000-0000-0000-0000-000000000001",
            "role": "incumbent",
            "engine": "e",
            "endpoint": "chat",
            "stream": False,
            "sent_at": "2026-12-01T00:00:00Z",
            "status": "ok",
            "request": {"messages": [{"content": "q"}], "temperature": 0},
            "output_text": text,
            "completion_tokens": completion_tokens,
            "logprobs": logprobs,
        }
    )


def test_full_capture_redacts_json_keys() -> None:
    rec = _record("ok", []).model_copy(
        update={
            "request": {
                "messages": [{"content": "q"}],
                "metadata": {"alice@example.com": {"bob@example.org": 1}, "carol@example.net": 2},
            }
        }
    )
    out = Privacy(PrivacyConfig()).apply(rec, "full")
    assert out.request["metadata"] == {"[EMAIL]": {"[EMAIL]": 1}, "[EMAIL] (2)": 2}


def test_full_capture_redacts_logprob_tokens_across_token_boundaries() -> None:
    # An e-mail address and a card number each split over several tokens; the alternatives at
    # those positions spell other pieces of them.
    pieces = ["Contact", " ali", "ce.s", "mith", "@exa", "mple", ".com", " or", " 4111",
              " 1111 11", "11 1111", "."]  # fmt: skip
    tops = [{"Contact": -0.1, "Call": -2.5}, {" ali": -0.2, " bob": -1.9},
            {"ce.s": -0.3, "cia": -1.1}, {"mith": -0.1, "myth": -3.0},
            {"@exa": -0.2, "@gmail": -1.5}, {"mple": -0.1}, {".com": -0.1, ".org": -2.0},
            {" or": -0.1, " and": -1.0}, {" 4111": -0.3, " 4242": -1.2},
            {" 1111 11": -0.2, " 1111": -1.6}, {"11 1111": -0.2, "11 1112": -4.0},
            {".": -0.1, "!": -2.2}]  # fmt: skip
    logprobs = [
        TokenLogprob(token=t, logprob=top[t], top=top) for t, top in zip(pieces, tops, strict=True)
    ]
    text = "".join(pieces)
    assert text == "Contact alice.smith@example.com or 4111 1111 1111 1111."
    out = Privacy(PrivacyConfig()).apply(_record(text, logprobs), "full")

    assert out.output_text == "Contact [EMAIL] or [CARD]."
    assert out.logprobs is not None and len(out.logprobs) == len(logprobs)
    assert "".join(lp.token for lp in out.logprobs) == out.output_text
    assert [lp.logprob for lp in out.logprobs] == [lp.logprob for lp in logprobs]
    assert [sorted(lp.top.values()) for lp in out.logprobs] == [
        sorted(top.values()) for top in tops
    ]
    dump = repr(out.logprobs)
    for secret in ("ali", "smith", "mith", "exa", "mple", "gmail", ".org", "4111", "4242",
                   "1111", "1112", "cia", "myth"):  # fmt: skip
        assert secret not in dump, secret
    # tokens outside the redacted spans are as they were, alternatives included
    for i in (0, 7, 11):
        assert out.logprobs[i] == logprobs[i]
    # each token's own entry among its alternatives follows its new text
    for lp in out.logprobs:
        assert lp.token in lp.top and lp.top[lp.token] == max(lp.top.values())
    # margins still work on the redacted tokens: a pair diverging after the address
    other = "Contact [EMAIL] and [CARD]."
    assert side_margin(out.logprobs, out.output_text, other) == (pytest.approx(0.9), False)


def test_none_capture_and_the_opt_out_header() -> None:
    inc, cand = Recorder(), Recorder(status=400)
    _, records = run_with_engines(
        inc, cand, [(chat(), {"x-shadow-capture": "none"}), (chat(), {"X-Shadow-Capture": "full"})]
    )
    first = [r for r in records if r.pair_id == records[0].pair_id]
    assert len(first) == 2
    for r in first:
        assert r.output_text is None and r.logprobs is None
        assert "messages" not in r.request and r.request["model"] == MODEL
        assert r.rewrites[-1] == "capture:none"
    cand_rec = next(r for r in first if r.role is Role.CANDIDATE)
    assert cand_rec.error and "bob@" not in cand_rec.error and "Paris" not in cand_rec.error
    assert "type=BadRequestError code=400" in cand_rec.error
    # "full" on a full deployment stays full (redacted)
    full = [r for r in records if r.pair_id != records[0].pair_id]
    assert len(full) == 2
    assert all(
        r.output_text == "Hello from the engine, write to [EMAIL]"
        for r in full
        if r.status is Status.OK
    )

    # the header never raises the level: a metadata deployment stays metadata
    _, records = run_with_engines(
        Recorder(),
        Recorder(),
        [(chat(), {"x-shadow-capture": "full"}), (chat(), {"x-shadow-capture": "bogus"})],
        privacy={"capture": "metadata"},
    )
    levels = {r.pair_id: r.rewrites[-1] for r in records}
    assert sorted(levels.values()) == ["capture:metadata", "capture:none"]


# -- files created 0600 ---------------------------------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_store_and_spool_files_are_private(tmp_path: Path) -> None:
    db = tmp_path / "records.db"
    engine = make_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (x)")
        conn.exec_driver_sql("INSERT INTO t VALUES (1)")
    assert _mode(db) == 0o600
    extras = list(tmp_path.glob("records.db-*"))
    engine.dispose()
    for extra in extras:
        if extra.exists():
            assert _mode(extra) == 0o600, extra

    spool_dir = tmp_path / "spool"
    spool = Spool(spool_dir, max_bytes=1 << 20, segment_bytes=1 << 16)
    try:
        spool.append(b"a private prompt")
    finally:
        spool.close()
    assert _mode(spool_dir) == 0o700
    files = [p for p in spool_dir.iterdir() if p.is_file()]
    assert files
    for p in files:
        if p.name != CURSOR_FILE:  # the cursor holds two offsets, no text
            assert _mode(p) == 0o600, p
