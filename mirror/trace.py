"""What one engine answered, and when: the timings and contents of one exchange.

The I/O code only notes *when* each piece arrived (``time.monotonic()`` seconds) and *what* it
was; everything computed from that lives here, free of I/O, tested with plain values:

- :class:`StreamTrace` takes the events of an SSE stream with their arrival times and computes
  the timings of docs/architecture.md, "Timing definitions" (the same as vLLM's benchmark):
  TTFT = first event with non-empty ``choices`` minus the send time; ITL = the gaps between
  successive such events; E2E = the last such event minus the send time (the usage event does
  not move it); TPOT = (E2E - TTFT) / (completion_tokens - 1), with ``completion_tokens`` from
  ``usage``. The output text is reassembled from the deltas of choice 0.
- :func:`stream_trace` builds a :class:`StreamTrace` from a stream's raw chunks and their
  arrival times (the mirror keeps those while it forwards, and parses them afterwards).
- :func:`parse_body` reads a non-streamed answer (E2E only: the whole body's arrival).

Both give an :class:`Outcome`. Logprobs (chat ``logprobs.content`` with ``top_logprobs``;
completions ``logprobs.tokens`` / ``token_logprobs`` / ``top_logprobs``) become
:class:`~shadow_ab.records.TokenLogprob` lists; a non-finite logprob is stored as
:data:`LOGPROB_FLOOR` (what vLLM itself sends for ``-inf``).

Errors: none; a malformed event is skipped and counted in ``Outcome.bad_events``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import orjson

from mirror.sse import SSEParser
from shadow_ab.records import INT32_MAX, TokenLogprob

LOGPROB_FLOOR = -9999.0


@dataclass
class Outcome:
    """The measured and parsed result of one exchange (all times relative to sending)."""

    ttft_s: float | None = None
    e2e_s: float | None = None
    tpot_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    output_text: str | None = None
    logprobs: list[TokenLogprob] | None = None
    events: int = 0
    """Events with non-empty ``choices`` (token events)."""
    bad_events: int = 0


def _finite(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return LOGPROB_FLOOR
    return v if math.isfinite(v) else LOGPROB_FLOOR


def _count(x: Any) -> int | None:
    if isinstance(x, bool) or not isinstance(x, int):
        return None
    return x if 0 <= x <= INT32_MAX else None


def chat_logprobs(lp: Any) -> list[TokenLogprob]:
    """``choices[i].logprobs`` of a chat answer or chunk: ``{"content": [{token, logprob,
    top_logprobs: [{token, logprob}]}]}``."""
    if not isinstance(lp, dict):
        return []
    out = []
    for item in lp.get("content") or ():
        if not isinstance(item, dict):
            continue
        top: dict[str, float] = {}
        for alt in item.get("top_logprobs") or ():
            if isinstance(alt, dict) and isinstance(alt.get("token"), str):
                top[alt["token"]] = _finite(alt.get("logprob"))
        out.append(
            TokenLogprob(
                token=str(item.get("token", "")), logprob=_finite(item.get("logprob")), top=top
            )
        )
    return out


def completion_logprobs(lp: Any) -> list[TokenLogprob]:
    """``choices[i].logprobs`` of a completion: parallel ``tokens``, ``token_logprobs`` and
    ``top_logprobs`` (a ``{token: logprob}`` per position, or null) lists."""
    if not isinstance(lp, dict):
        return []
    tokens = lp.get("tokens") or []
    values = lp.get("token_logprobs") or []
    tops = lp.get("top_logprobs") or []
    out = []
    for i, tok in enumerate(tokens):
        top_raw = tops[i] if i < len(tops) else None
        top = {str(k): _finite(v) for k, v in top_raw.items()} if isinstance(top_raw, dict) else {}
        value = values[i] if i < len(values) else None
        out.append(TokenLogprob(token=str(tok), logprob=_finite(value), top=top))
    return out


def _tpot(o: Outcome) -> float | None:
    n = o.completion_tokens
    if o.ttft_s is None or o.e2e_s is None or n is None or n < 2:
        return None
    return max(0.0, (o.e2e_s - o.ttft_s) / (n - 1))


def _usage(o: Outcome, usage: Any) -> None:
    if isinstance(usage, dict):
        o.prompt_tokens = _count(usage.get("prompt_tokens"))
        o.completion_tokens = _count(usage.get("completion_tokens"))


class StreamTrace:
    """The events of one SSE stream as they arrived; :meth:`outcome` computes the rest.

    ``chat`` picks where text and logprobs are (``delta.content`` and ``logprobs.content`` vs
    ``text`` and the completions logprobs lists). Times are absolute ``monotonic()`` values;
    ``sent`` is the moment the request was sent.
    """

    __slots__ = ("_events", "chat", "sent")

    def __init__(self, sent: float, *, chat: bool) -> None:
        self.sent = sent
        self.chat = chat
        self._events: list[tuple[float, bytes]] = []

    def add(self, t: float, data: bytes | None) -> None:
        """Note one event's data and its arrival time (cheap: parsed later)."""
        if data is not None:
            self._events.append((t, data))

    def outcome(self) -> Outcome:
        o = Outcome()
        text: list[str] = []
        logprobs: list[TokenLogprob] = []
        saw_logprobs = False
        last: float | None = None
        chat = self.chat
        loads = orjson.loads
        for t, data in self._events:
            if data == b"[DONE]":
                continue  # not JSON: cheaper to skip than to fail parsing
            try:
                obj = loads(data)
            except orjson.JSONDecodeError:
                if data.strip() != b"[DONE]":
                    o.bad_events += 1
                continue
            if type(obj) is not dict:
                o.bad_events += 1
                continue
            usage = obj.get("usage")
            if usage:
                _usage(o, usage)
            choices = obj.get("choices")
            if not choices or type(choices) is not list:
                continue
            if last is None:
                o.ttft_s = max(0.0, t - self.sent)
            else:
                o.itl_s.append(max(0.0, t - last))
            last = t
            o.events += 1
            for ch in choices:
                if type(ch) is not dict or ch.get("index", 0) != 0:
                    continue
                if chat:
                    delta = ch.get("delta")
                    if delta and type(delta) is dict:
                        content = delta.get("content")
                        if type(content) is str:
                            text.append(content)
                else:
                    content = ch.get("text")
                    if type(content) is str:
                        text.append(content)
                lp = ch.get("logprobs")
                if lp is not None:
                    saw_logprobs = True
                    logprobs.extend(chat_logprobs(lp) if chat else completion_logprobs(lp))
                finish = ch.get("finish_reason")
                if finish is not None:
                    o.finish_reason = str(finish)
        if last is not None:
            o.e2e_s = max(0.0, last - self.sent)
            o.output_text = "".join(text)
        if saw_logprobs:
            o.logprobs = logprobs
        o.tpot_s = _tpot(o)
        return o


def parse_body(body: bytes, *, chat: bool, e2e_s: float) -> Outcome:
    """A non-streamed answer: E2E only, usage, text, finish reason and logprobs of choice 0."""
    o = Outcome(e2e_s=max(0.0, e2e_s))
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        o.bad_events = 1
        return o
    if not isinstance(obj, dict):
        o.bad_events = 1
        return o
    _usage(o, obj.get("usage"))
    choices = obj.get("choices")
    if isinstance(choices, list):
        for ch in choices:
            if not isinstance(ch, dict) or ch.get("index", 0) != 0:
                continue
            if chat:
                msg = ch.get("message")
                if isinstance(msg, dict) and isinstance(msg.get("content"), str):
                    o.output_text = msg["content"]
                lp = ch.get("logprobs")
                if lp is not None:
                    o.logprobs = chat_logprobs(lp)
            else:
                if isinstance(ch.get("text"), str):
                    o.output_text = ch["text"]
                lp = ch.get("logprobs")
                if lp is not None:
                    o.logprobs = completion_logprobs(lp)
            if ch.get("finish_reason") is not None:
                o.finish_reason = str(ch["finish_reason"])
            break
    return o


def stream_trace(chunks: list[tuple[float, bytes]], sent: float, *, chat: bool) -> StreamTrace:
    """The trace of an SSE stream from its chunks and their arrival times (an event's time is
    that of the chunk completing it). Chunks of whole ``data: ...`` events (the engines' usual
    framing) are split without the general parser; anything else goes through it."""
    trace = StreamTrace(sent, chat=chat)
    add = trace.add
    parser = SSEParser()
    for t, chunk in chunks:
        if chunk[-2:] == b"\n\n" and b"\r" not in chunk and parser.idle():
            for block in chunk[:-2].split(b"\n\n"):
                if block[:6] == b"data: " and b"\n" not in block:
                    add(t, block[6:])
                else:
                    for e in parser.feed(block + b"\n\n"):
                        add(t, e.data)
        else:
            for e in parser.feed(chunk):
                add(t, e.data)
    return trace
