"""Client traffic for the engines and the mirror: a request mix, a load plan, client-side timings.

Used by ``bench/mirror_overhead.py``, ``shadow-ab demo`` and tests::

    mix = TrafficMix()                     # the realistic mix; TrafficMix.uniform() for benchmarks
    plan = LoadPlan(concurrency=32, requests=500)       # closed loop; LoadPlan(rate=20, ...) open
    result = run_traffic_sync("http://127.0.0.1:8000", mix, plan)
    result.p50("ttft_s"), result.p99("e2e_s"), result.requests_per_s, result.rows

The mix (:class:`TrafficMix`, shares configurable): a few shared system prompts, short and long
user prompts built from a small built-in vocabulary (nothing is downloaded), chat and
completions, streaming and not, greedy (``temperature: 0``) and sampled (``temperature > 0``
with a ``seed``), a share asking for JSON (``response_format``), explicit ``max_tokens`` on
every request, and a session id header (``x-session-id``) so that whole conversations can be
sampled consistently; chat turns of a session carry the session's earlier turns.
:meth:`TrafficMix.uniform` is one fixed shape (streaming greedy chat, short prompt) for
benchmarks, where a spread of request shapes would only add variance.

The plan (:class:`LoadPlan`): closed loop at a ``concurrency`` (each worker sends its next
request when the previous one finished) or open loop at a ``rate`` (Poisson or evenly spaced
arrivals, whatever the answers do), for a ``requests`` count and/or a ``duration_s``.

Timings (:class:`RequestRow`), as the client sees them, on a monotonic clock from the moment
the request is handed to the HTTP client: TTFT = the first SSE event with non-empty
``choices`` (streamed requests only); E2E = the last such event (streamed) or the end of the
body (not streamed); ``done_s`` = the end of the body. SSE is parsed by the spec (``data:``
lines, events ended by a blank line, any of CRLF/LF/CR), not by bytes. Each row also keeps the
HTTP status (0 when no HTTP answer came), bytes received, events, ``completion_tokens`` when a
usage object says, and the ``x-shadow-pair-id`` response header when a mirror set it.

Errors::

    TrafficError    a mix or plan that cannot be run (a ValueError)
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import aiohttp
import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shadow_ab.records import Endpoint

DEFAULT_MODEL = "sim-llama-3-8b-instruct"
SESSION_HEADER = "x-session-id"
PAIR_ID_HEADER = "x-shadow-pair-id"

PATHS: dict[Endpoint, str] = {
    Endpoint.CHAT: "/v1/chat/completions",
    Endpoint.COMPLETIONS: "/v1/completions",
}
Timing = Literal["ttft_s", "e2e_s", "done_s"]


class TrafficError(ValueError):
    """A traffic mix or load plan that cannot be run, with a sentence saying what to fix."""


# -- the request mix -----------------------------------------------------------------------

SYSTEM_PROMPTS: tuple[str, ...] = (
    "You are a helpful assistant. Answer clearly and briefly, and say so when you are not sure.",
    "You are a support agent for a cloud storage company. Be polite, ask for the account id"
    " when you need it, and never promise refunds.",
    "You are a senior software engineer reviewing code. Point out bugs first, then style, and"
    " suggest a concrete fix for each problem you find.",
    "You summarise documents for busy readers: give three bullet points, then one sentence on"
    " what the reader should do next.",
)

_WORDS = (
    "the of and to in is that for it as with on be by this are or at from an which have not"
    " but all they one more when there can some into than then only over also after most"
    " system model engine request token cache memory batch latency answer output input server"
    " client stream value result test review question reason simple clear quick light heavy"
    " fast slow early late river mountain forest ocean island valley garden bridge tower market"
    " energy signal pattern measure balance change growth limit range field layer graph vector"
    " north south east west summer winter morning evening build write read find keep give"
    " show move turn run learn teach begin finish price order account storage report team plan"
    " budget schedule customer invoice policy release version upgrade backup database network"
).split()

_ASKS = (
    "Explain",
    "Summarise",
    "Compare",
    "List the risks of",
    "Write a short note about",
    "What is the difference between",
    "Give an example of",
    "Why does",
    "How should we handle",
    "Translate into plain words",
)

_JSON_ASKS = (
    'Reply only with a JSON object with keys "summary" and "tags".',
    'Return JSON: {"answer": string, "confidence": number}.',
    'Answer as a JSON object with the keys "steps" (a list) and "done" (a boolean).',
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Share = Annotated[float, Field(ge=0.0, le=1.0)]


class TrafficMix(_Strict):
    """What the requests look like; every share is a probability per request (or session)."""

    mode: Literal["mix", "uniform"] = "mix"
    model: str = DEFAULT_MODEL
    chat_share: Share = 0.75
    """Share of sessions that use chat completions (the rest use completions)."""
    stream_share: Share = 0.7
    greedy_share: Share = 0.5
    """Share of requests with ``temperature: 0``; the others sample (0.7-1.0) with a seed."""
    json_share: Share = 0.1
    """Share of requests asking for ``response_format: {"type": "json_object"}``."""
    long_prompt_share: Share = 0.2
    short_prompt_words: tuple[int, int] = (4, 40)
    long_prompt_words: tuple[int, int] = (300, 1200)
    max_tokens: tuple[int, ...] = (32, 64, 128, 256)
    """Each request's ``max_tokens`` is drawn from these (explicit on every request)."""
    sessions: Annotated[int, Field(ge=1)] = 64
    """Live sessions at once; each request continues a random one."""
    max_turns: Annotated[int, Field(ge=1)] = 6
    """A session ends after this many turns and a new one (new id) takes its place."""
    session_header: str = SESSION_HEADER
    system_prompts: tuple[str, ...] = SYSTEM_PROMPTS
    uniform_prompt: str = "Explain in two sentences why the sky is blue."
    uniform_max_tokens: Annotated[int, Field(ge=1)] = 32

    @model_validator(mode="after")
    def _ranges(self) -> TrafficMix:
        for name in ("short_prompt_words", "long_prompt_words"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"{name} must be (low, high) with 1 <= low <= high")
        if not self.max_tokens or min(self.max_tokens) < 1:
            raise ValueError("max_tokens must list at least one value, each >= 1")
        if not self.system_prompts:
            raise ValueError("system_prompts must hold at least one prompt")
        return self

    @classmethod
    def uniform(cls, *, max_tokens: int = 32, **kwargs: Any) -> TrafficMix:
        """One fixed shape: streaming greedy chat, a short prompt, ``max_tokens`` tokens."""
        return make_mix(mode="uniform", uniform_max_tokens=max_tokens, **kwargs)


def make_mix(**kwargs: Any) -> TrafficMix:
    """:class:`TrafficMix` from keyword values, raising :class:`TrafficError` when invalid."""
    try:
        return TrafficMix(**kwargs)
    except ValidationError as exc:
        raise TrafficError(f"invalid traffic mix: {exc}") from exc


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: where, what, and labels for reading the results."""

    endpoint: Endpoint
    body: dict[str, Any]
    headers: dict[str, str]
    session_id: str
    turn: int

    @property
    def path(self) -> str:
        return PATHS[self.endpoint]

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def kind(self) -> str:
        """A short label such as ``chat/stream/greedy`` or ``completions/plain/sampled/json``."""
        parts = [self.endpoint, "stream" if self.stream else "plain"]
        parts.append("greedy" if self.body.get("temperature") == 0 else "sampled")
        if "response_format" in self.body:
            parts.append("json")
        return "/".join(parts)


@dataclass
class _Session:
    id: str
    endpoint: Endpoint
    system: str
    history: list[dict[str, str]] = field(default_factory=list)
    turns: int = 0


class RequestGenerator:
    """Deterministic requests for one mix: the same ``seed`` gives the same sequence."""

    def __init__(self, mix: TrafficMix, seed: int = 0) -> None:
        self.mix = mix
        self._rng = random.Random(seed)
        self._seed = seed
        self._session_no = 0
        self._sessions: list[_Session] = []
        self._count = 0

    def __iter__(self) -> RequestGenerator:
        return self

    def __next__(self) -> RequestSpec:
        return self.next()

    def next(self) -> RequestSpec:
        self._count += 1
        if self.mix.mode == "uniform":
            return self._uniform()
        return self._mixed()

    # -- uniform: one shape, session ids still vary (so sampling by session still applies)
    def _uniform(self) -> RequestSpec:
        mix = self.mix
        session_id = f"u{self._seed}-{self._count % mix.sessions}"
        body: dict[str, Any] = {
            "model": mix.model,
            "messages": [
                {"role": "system", "content": mix.system_prompts[0]},
                {"role": "user", "content": mix.uniform_prompt},
            ],
            "max_tokens": mix.uniform_max_tokens,
            "temperature": 0,
            "stream": True,
        }
        return RequestSpec(Endpoint.CHAT, body, {mix.session_header: session_id}, session_id, 1)

    # -- the realistic mix
    def _new_session(self) -> _Session:
        self._session_no += 1
        rng, mix = self._rng, self.mix
        endpoint = Endpoint.CHAT if rng.random() < mix.chat_share else Endpoint.COMPLETIONS
        return _Session(
            id=f"s{self._seed}-{self._session_no}",
            endpoint=endpoint,
            system=rng.choice(mix.system_prompts),
        )

    def _session(self) -> _Session:
        if len(self._sessions) < self.mix.sessions:
            self._sessions.append(self._new_session())
            return self._sessions[-1]
        i = self._rng.randrange(len(self._sessions))
        if self._sessions[i].turns >= self.mix.max_turns:
            self._sessions[i] = self._new_session()
        return self._sessions[i]

    def _words(self, lo: int, hi: int) -> str:
        n = self._rng.randint(lo, hi)
        words = self._rng.choices(_WORDS, k=n)
        # sentences of 6-18 words, so long prompts read like paragraphs
        out: list[str] = []
        until = self._rng.randint(6, 18)
        for i, w in enumerate(words):
            out.append(w)
            if i + 1 == until:
                out[-1] += "."
                until += self._rng.randint(6, 18)
        return " ".join(out)

    def _user_prompt(self, json_ask: bool) -> str:
        rng, mix = self._rng, self.mix
        long = rng.random() < mix.long_prompt_share
        lo, hi = mix.long_prompt_words if long else mix.short_prompt_words
        text = f"{rng.choice(_ASKS)} {self._words(lo, hi)}"
        if long:
            text = f"{rng.choice(_ASKS)} the following text.\n\n{self._words(lo, hi)}"
        if json_ask:
            text += "\n" + rng.choice(_JSON_ASKS)
        return text

    def _mixed(self) -> RequestSpec:
        rng, mix = self._rng, self.mix
        s = self._session()
        s.turns += 1
        json_ask = rng.random() < mix.json_share
        user = self._user_prompt(json_ask)
        body: dict[str, Any] = {"model": mix.model, "max_tokens": rng.choice(mix.max_tokens)}
        if s.endpoint == Endpoint.CHAT:
            messages = [{"role": "system", "content": s.system}, *s.history]
            messages.append({"role": "user", "content": user})
            body["messages"] = messages
            # the next turn sees this one (with a stand-in answer: the engines' text is not
            # needed for realistic prompt shapes)
            s.history += [
                {"role": "user", "content": user},
                {"role": "assistant", "content": self._words(8, 40)},
            ]
            del s.history[: max(0, len(s.history) - 8)]  # keep the last 4 turns
        else:
            body["prompt"] = f"{s.system}\n\nUser: {user}\nAssistant:"
        if rng.random() < mix.greedy_share:
            body["temperature"] = 0
        else:
            body["temperature"] = round(rng.uniform(0.7, 1.0), 2)
            body["seed"] = rng.randrange(2**31)
        if json_ask:
            body["response_format"] = {"type": "json_object"}
        if rng.random() < mix.stream_share:
            body["stream"] = True
        headers = {mix.session_header: s.id}
        return RequestSpec(s.endpoint, body, headers, s.id, s.turns)


# -- the load plan -------------------------------------------------------------------------


class LoadPlan(_Strict):
    """How hard and how long: closed loop (``concurrency``) or open loop (``rate``)."""

    concurrency: Annotated[int, Field(ge=1)] | None = None
    rate: Annotated[float, Field(gt=0)] | None = None
    """Requests per second (open loop); arrivals Poisson unless ``arrivals="even"``."""
    arrivals: Literal["poisson", "even"] = "poisson"
    max_in_flight: Annotated[int, Field(ge=1)] | None = None
    """Open loop only: arrivals beyond this many in flight are not sent (counted as skipped)."""
    requests: Annotated[int, Field(ge=1)] | None = None
    duration_s: Annotated[float, Field(gt=0)] | None = None
    timeout_s: Annotated[float, Field(gt=0)] = 120.0
    seed: int = 0

    @model_validator(mode="after")
    def _one_mode(self) -> LoadPlan:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of concurrency (closed loop) or rate (open loop)")
        if self.requests is None and self.duration_s is None:
            raise ValueError("give requests (a count), duration_s, or both (whichever ends first)")
        return self


def make_plan(**kwargs: Any) -> LoadPlan:
    """:class:`LoadPlan` from keyword values, raising :class:`TrafficError` when invalid."""
    try:
        return LoadPlan(**kwargs)
    except ValidationError as exc:
        raise TrafficError(f"invalid load plan: {exc}") from exc


# -- results -------------------------------------------------------------------------------


@dataclass
class RequestRow:
    """One request as the client saw it; times in seconds on the run's monotonic clock."""

    index: int
    kind: str
    endpoint: Endpoint
    stream: bool
    session_id: str
    sent_at: float
    """When the request was handed to the HTTP client, since the run started."""
    status: int = 0
    """HTTP status; 0 when no HTTP answer came (connection error, timeout before headers)."""
    error: str | None = None
    """None for a 2xx answer read to the end, else ``http_<status>``, ``timeout`` or
    ``connection_error: ...``."""
    ttft_s: float | None = None
    e2e_s: float | None = None
    done_s: float | None = None
    bytes: int = 0
    events: int = 0
    """SSE events with non-empty ``choices``."""
    completion_tokens: int | None = None
    pair_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation between order statistics (numpy's
    default); NaN for no values."""
    if not 0.0 <= q <= 1.0:
        raise ValueError("q must be within [0, 1]")
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class TrafficResult:
    """Every request's row, the run's wall time, and percentile helpers over the OK rows."""

    rows: list[RequestRow]
    wall_s: float
    skipped: int = 0
    """Open loop: arrivals not sent because ``max_in_flight`` requests were in flight."""

    @property
    def ok_rows(self) -> list[RequestRow]:
        return [r for r in self.rows if r.ok]

    @property
    def errors(self) -> list[RequestRow]:
        return [r for r in self.rows if not r.ok]

    @property
    def requests_per_s(self) -> float:
        """Requests answered OK per second of the run."""
        return len(self.ok_rows) / self.wall_s if self.wall_s > 0 else math.nan

    def values(self, name: Timing, rows: Iterable[RequestRow] | None = None) -> list[float]:
        """The non-missing values of one timing over ``rows`` (default: the OK rows)."""
        chosen = self.ok_rows if rows is None else rows
        return [v for r in chosen if (v := getattr(r, name)) is not None]

    def quantile(self, name: Timing, q: float) -> float:
        return quantile(self.values(name), q)

    def p50(self, name: Timing) -> float:
        return self.quantile(name, 0.50)

    def p95(self, name: Timing) -> float:
        return self.quantile(name, 0.95)

    def p99(self, name: Timing) -> float:
        return self.quantile(name, 0.99)

    def summary(self) -> dict[str, float | int]:
        """Counts, rate and p50/p95/p99 of TTFT and E2E (seconds), JSON-able."""
        out: dict[str, float | int] = {
            "requests": len(self.rows),
            "ok": len(self.ok_rows),
            "errors": len(self.errors),
            "skipped": self.skipped,
            "wall_s": self.wall_s,
            "requests_per_s": self.requests_per_s,
        }
        names: tuple[Timing, ...] = ("ttft_s", "e2e_s")
        for name in names:
            for label, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
                out[f"{name[:-2]}_{label}_s"] = self.quantile(name, q)
        return out


# -- sending -------------------------------------------------------------------------------


class _SSE:
    """Incremental SSE parser (WHATWG rules for ``data:`` fields): feed bytes, get events."""

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []
        self._after_cr = False

    def feed(self, chunk: bytes) -> list[bytes]:
        """The data of every event completed by ``chunk`` (multi-line data joined by LF)."""
        if self._after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # the LF of a CRLF split across chunks
        self._after_cr = False
        self._buf += chunk
        events: list[bytes] = []
        while True:
            cut = _line_end(self._buf)
            if cut is None:
                return events
            end, nxt = cut
            # a lone CR ending the buffer: its LF, if any, is the next chunk's first byte
            self._after_cr = nxt == len(self._buf) and self._buf.endswith(b"\r")
            line = self._buf[:end]
            self._buf = self._buf[nxt:]
            if not line:
                if self._data:
                    events.append(b"\n".join(self._data))
                    self._data = []
                continue
            if line.startswith(b":"):
                continue  # comment
            name, _, value = line.partition(b":")
            if name == b"data":
                self._data.append(value[1:] if value.startswith(b" ") else value)


def _line_end(buf: bytes) -> tuple[int, int] | None:
    """(end of the first line, start of the next) for CRLF, LF or CR endings, else None."""
    lf = buf.find(b"\n")
    cr = buf.find(b"\r", 0, lf if lf >= 0 else len(buf))
    if cr >= 0:
        return cr, cr + 2 if buf[cr + 1 : cr + 2] == b"\n" else cr + 1
    if lf >= 0:
        return lf, lf + 1
    return None


def _usage_tokens(obj: Any) -> int | None:
    usage = obj.get("usage") if isinstance(obj, dict) else None
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        return int(usage["completion_tokens"])
    return None


async def send_one(
    session: aiohttp.ClientSession,
    base_url: str,
    spec: RequestSpec,
    *,
    index: int = 0,
    t0: float = 0.0,
    timeout_s: float = 120.0,
    clock: Callable[[], float] = time.monotonic,
) -> RequestRow:
    """Send one request and read its answer to the end, timing it from the client's side."""
    url = base_url.rstrip("/").removesuffix("/v1") + spec.path
    data = orjson.dumps(spec.body)
    headers = {"content-type": "application/json", **spec.headers}
    sent = clock()
    row = RequestRow(
        index=index,
        kind=spec.kind,
        endpoint=spec.endpoint,
        stream=spec.stream,
        session_id=spec.session_id,
        sent_at=sent - t0,
    )
    last_event: float | None = None
    try:
        async with session.post(
            url, data=data, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            row.status = resp.status
            row.pair_id = resp.headers.get(PAIR_ID_HEADER)
            ok = 200 <= resp.status < 300
            if spec.stream and ok:
                parser = _SSE()
                async for chunk in resp.content.iter_any():
                    now = clock()
                    row.bytes += len(chunk)
                    for event in parser.feed(chunk):
                        if event == b"[DONE]":
                            continue
                        try:
                            obj = orjson.loads(event)
                        except orjson.JSONDecodeError:
                            continue
                        if isinstance(obj, dict) and obj.get("choices"):
                            row.events += 1
                            if row.ttft_s is None:
                                row.ttft_s = now - sent
                            last_event = now
                        tokens = _usage_tokens(obj)
                        if tokens is not None:
                            row.completion_tokens = tokens
            else:
                body = await resp.read()
                row.bytes = len(body)
                if ok:
                    with contextlib.suppress(orjson.JSONDecodeError):
                        row.completion_tokens = _usage_tokens(orjson.loads(body))
            end = clock()
            row.done_s = end - sent
            row.e2e_s = (last_event if spec.stream and last_event is not None else end) - sent
            if not ok:
                row.error = f"http_{resp.status}"
    except TimeoutError:
        row.error = "timeout"
    except aiohttp.ClientError as exc:
        row.error = f"connection_error: {type(exc).__name__}: {exc}"
    return row


async def run_traffic(
    session: aiohttp.ClientSession,
    base_url: str,
    mix: TrafficMix | RequestGenerator,
    plan: LoadPlan,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> TrafficResult:
    """Send ``plan``'s traffic to ``base_url`` (the server root, ``/v1`` optional) on ``session``.

    Give the session a connector with enough connections for the plan (``limit=0`` or at least
    the concurrency); :func:`run_traffic_sync` makes one."""
    gen = mix if isinstance(mix, RequestGenerator) else RequestGenerator(mix, plan.seed)
    t0 = clock()
    deadline = t0 + plan.duration_s if plan.duration_s is not None else math.inf
    rows: list[RequestRow] = []
    issued = 0

    def take() -> tuple[int, RequestSpec] | None:
        nonlocal issued
        if plan.requests is not None and issued >= plan.requests:
            return None
        if clock() >= deadline:
            return None
        issued += 1
        return issued - 1, gen.next()

    async def one(i: int, spec: RequestSpec) -> None:
        rows.append(
            await send_one(
                session, base_url, spec, index=i, t0=t0, timeout_s=plan.timeout_s, clock=clock
            )
        )

    skipped = 0
    if plan.concurrency is not None:

        async def worker() -> None:
            while (job := take()) is not None:
                await one(*job)

        await asyncio.gather(*(worker() for _ in range(plan.concurrency)))
    else:
        assert plan.rate is not None
        rng = random.Random(plan.seed ^ 0x5EED)
        tasks: set[asyncio.Task[None]] = set()
        next_at = t0
        arrivals = 0
        while True:
            delay = next_at - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            if plan.requests is not None and arrivals >= plan.requests:
                break
            if clock() >= deadline:
                break
            arrivals += 1
            if plan.max_in_flight is not None and len(tasks) >= plan.max_in_flight:
                skipped += 1
            else:
                task = asyncio.create_task(one(arrivals - 1, gen.next()))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if plan.arrivals == "poisson":
                next_at += rng.expovariate(plan.rate)
            else:
                next_at += 1.0 / plan.rate
        if tasks:
            await asyncio.gather(*tasks)
    rows.sort(key=lambda r: r.index)
    return TrafficResult(rows=rows, wall_s=clock() - t0, skipped=skipped)


def make_session(connections: int = 0) -> aiohttp.ClientSession:
    """A client session with keep-alive and ``connections`` pooled connections (0 = no limit)."""
    connector = aiohttp.TCPConnector(limit=connections, limit_per_host=0, force_close=False)
    return aiohttp.ClientSession(connector=connector, auto_decompress=False)


def run_traffic_sync(
    base_url: str,
    mix: TrafficMix | None = None,
    plan: LoadPlan | None = None,
    **plan_kwargs: Any,
) -> TrafficResult:
    """:func:`run_traffic` in a fresh event loop and session (for scripts and sync tests).

    ``plan_kwargs`` build the plan when none is given (``concurrency=4, requests=20``)."""
    the_plan = plan or make_plan(**plan_kwargs)
    the_mix = mix or TrafficMix()

    async def go() -> TrafficResult:
        async with make_session() as session:
            return await run_traffic(session, base_url, the_mix, the_plan)

    return asyncio.run(go())
