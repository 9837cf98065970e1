"""Server-sent events, parsed by the spec (WHATWG HTML, "Parsing an event stream"), incrementally.

Engines frame their streams slightly differently (TensorRT-LLM writes ``data: {...} \\n\\n``
with a space before the blank line; a proxy may use ``\\r\\n``), so the mirror never matches
bytes: :class:`SSEParser` is fed the chunks as they arrive and returns every complete event
together with the raw bytes that carried it. The mirror forwards those raw bytes untouched,
except for an event it must hide from the client (a usage chunk the client did not ask for),
and :class:`UsageHider` undoes what asking for that chunk changed elsewhere in the stream:
vLLM (0.32) stamps ``system_fingerprint`` on each choice's finish chunk only when no usage
chunk follows, and on the usage chunk otherwise.

Pure: no I/O, no clock. Errors: none (malformed lines are ignored, as the spec says).
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import orjson

DONE = b"[DONE]"
_EMPTY_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')
_EMPTY_CHOICES_RAW = re.compile(rb'"choices"(?:\s|data:)*:(?:\s|data:)*\[(?:\s|data:)*\]')
"""As ``_EMPTY_CHOICES`` but on a stream's raw bytes, where data may go on in another
``data:`` line."""
_FINISH = re.compile(rb'"finish_reason"\s*:\s*"')
_FINISH_RAW = re.compile(rb'"finish_reason"(?:\s|data:)*:(?:\s|data:)*"')
"""A finish reason that is a string (not ``null``): an event that ends a choice."""
_FINGERPRINT = re.compile(rb'(,\s*)?("system_fingerprint"\s*:\s*"(?:[^"\\]|\\.)*")')
FINGERPRINT = "system_fingerprint"


class SSEEvent(NamedTuple):
    """One dispatched event (or, with ``data`` None, bytes that dispatched nothing)."""

    data: bytes | None
    """The event's data (``data:`` lines joined with ``\\n``), None when the block had none."""
    raw: bytes
    """The exact bytes from the end of the previous event to the end of this one's blank line."""
    event: str | None = None
    """The ``event:`` field, if any (OpenAI streams have none)."""


class SSEParser:
    """Incremental parser: ``feed`` chunks, get the events they complete."""

    __slots__ = ("_buf", "_data", "_event", "_has_data", "_pos", "_start")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._start = 0  # where the current (not yet dispatched) event's bytes begin
        self._pos = 0  # where the next line begins
        self._data: list[bytes] = []
        self._has_data = False
        self._event: str | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Take the next bytes of the stream; return the events they complete, in order."""
        if not self._buf and b"\r" not in chunk and b"\n\n\n" not in chunk and chunk[:1] != b"\n":
            return self._feed_lf(chunk)
        return self._feed_any(chunk)

    def _feed_lf(self, chunk: bytes) -> list[SSEEvent]:
        """The common case, fast: LF line ends, every event starting in this chunk."""
        blocks = chunk.split(b"\n\n")
        out = []
        for block in blocks[:-1]:
            data: list[bytes] = []
            event: str | None = None
            for line in block.split(b"\n"):
                if line[:5] == b"data:":
                    value = line[5:]
                    data.append(value[1:] if value[:1] == b" " else value)
                elif line == b"data":
                    data.append(b"")
                elif line[:6] == b"event:":
                    value = line[6:]
                    event = (value[1:] if value[:1] == b" " else value).decode("utf-8", "replace")
            payload = (data[0] if len(data) == 1 else b"\n".join(data)) if data else None
            out.append(SSEEvent(payload, block + b"\n\n", event))
        rest = blocks[-1]
        if rest:
            out.extend(self._feed_any(rest))
        return out

    def _feed_any(self, chunk: bytes) -> list[SSEEvent]:
        buf = self._buf
        buf += chunk
        out: list[SSEEvent] = []
        n = len(buf)
        pos = self._pos
        while pos < n:
            lf = buf.find(b"\n", pos)
            cr = buf.find(b"\r", pos, lf if lf >= 0 else n)
            if cr >= 0:
                if cr + 1 == n:
                    break  # a trailing CR: wait for the next byte (it may be CRLF)
                end = cr
                nxt = cr + 2 if buf[cr + 1] == 0x0A else cr + 1
            elif lf >= 0:
                end = lf
                nxt = lf + 1
            else:
                break
            if end == pos:  # a blank line: dispatch
                out.append(self._dispatch(bytes(buf[self._start : nxt])))
                self._start = nxt
            else:
                self._field(bytes(buf[pos:end]))
            pos = nxt
        # Keep only the bytes of the event under way.
        if self._start:
            del buf[: self._start]
            pos -= self._start
            self._start = 0
        self._pos = pos
        return out

    def idle(self) -> bool:
        """No unfinished event is held (the next byte starts a new event)."""
        return not self._buf

    def pending(self) -> bytes:
        """Bytes received that no event has carried yet (an unfinished event at stream end)."""
        return bytes(self._buf)

    def _field(self, line: bytes) -> None:
        if line[:1] == b":":
            return  # a comment
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
            self._has_data = True
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        # id, retry and unknown fields do not matter here

    def _dispatch(self, raw: bytes) -> SSEEvent:
        data = b"\n".join(self._data) if self._has_data else None
        event = SSEEvent(data, raw, self._event)
        self._data = []
        self._has_data = False
        self._event = None
        return event


def decode_data(data: bytes | None) -> dict[str, Any] | None:
    """The JSON object an OpenAI stream event carries; None for ``[DONE]``, non-JSON or
    non-object data."""
    if data is None:
        return None
    stripped = data.strip()
    if not stripped or stripped == DONE:
        return None
    try:
        obj = orjson.loads(stripped)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def is_usage_only(data: bytes | None) -> bool:
    """Whether an event is the usage chunk ``include_usage`` adds: empty ``choices`` and a
    ``usage`` object. Cheap byte checks first, the JSON parse only for candidates."""
    if data is None or b'"usage"' not in data or _EMPTY_CHOICES.search(data) is None:
        return False
    obj = decode_data(data)
    return obj is not None and obj.get("choices") == [] and isinstance(obj.get("usage"), dict)


def finishes_without_fingerprint(data: bytes | None) -> bool:
    """Whether an event ends a choice (a ``finish_reason`` that is not null) and has no
    ``system_fingerprint`` key. A byte check first, the JSON parse only for candidates."""
    if data is None or _FINISH.search(data) is None:
        return False
    obj = decode_data(data)
    if obj is None or FINGERPRINT in obj:
        return False
    choices = obj.get("choices")
    return isinstance(choices, list) and any(
        isinstance(c, dict) and c.get("finish_reason") is not None for c in choices
    )


def passes_whole(parser: SSEParser, chunk: bytes) -> bool:
    """Whether ``chunk`` may be forwarded as it is where usage events are hidden: the parser
    holds no unfinished event, the chunk ends exactly at an event's end (LF framing), no event
    in it can be a usage-only one (byte checks, as :func:`is_usage_only`'s first ones), and
    none can end a choice (:func:`finishes_without_fingerprint`'s byte check). When False, the
    chunk goes through ``parser``; when True, the parser is not fed it (its state is the same
    either way: nothing pending)."""
    return (
        parser.idle()
        and chunk[-2:] == b"\n\n"
        and b"\r" not in chunk
        and (b'"usage"' not in chunk or _EMPTY_CHOICES_RAW.search(chunk) is None)
        and _FINISH_RAW.search(chunk) is None
    )


def add_field(raw: bytes, field: bytes) -> bytes:
    """An event's raw bytes with ``field`` (``,"key":value``) inserted before the closing brace
    of its JSON object, which becomes the object's last member; unchanged when the event does
    not end with a JSON object."""
    end = raw.rfind(b"}")
    if end < 0 or raw[end + 1 :].strip():
        return raw
    return raw[:end] + field + raw[end:]


def fingerprint_field(data: bytes | None) -> bytes | None:
    """The ``,"system_fingerprint":"..."`` member of a usage event, as the engine wrote it
    (its separator and spacing), or None when it has no fingerprint string."""
    if data is None:
        return None
    m = _FINGERPRINT.search(data)
    if m is None:
        return None
    obj = decode_data(data)
    if obj is None or not isinstance(obj.get(FINGERPRINT), str):
        return None
    return (m.group(1) or b",") + m.group(2)


class UsageHider:
    """The client's view of a stream whose usage event the mirror asked for and must hide.

    Asking for ``stream_options.include_usage`` changes two things in vLLM's stream (0.32,
    ``serving_chat.py`` and ``serving_completion.py``): a usage event (empty ``choices``) comes
    before ``[DONE]``, and ``system_fingerprint`` moves from each choice's finish event onto it.
    :meth:`feed` forwards every other event's raw bytes, and drops the usage event. From the
    first event that ends a choice without a fingerprint, events are held back (in order) until
    the usage event arrives; then each held finish event gets the usage event's
    ``system_fingerprint`` member back, as its last member (where vLLM writes it), and all are
    released. A usage event without a fingerprint releases them unchanged (an engine that never
    sends one, such as TensorRT-LLM); an engine that stamps every event keeps its own.

    Times are passed in (``t``, monotonic seconds): :attr:`held_s` is how long events were held
    (None when nothing was). Pure: no I/O, no clock.
    """

    __slots__ = ("_held", "_since", "held_s", "parser")

    def __init__(self) -> None:
        self.parser = SSEParser()
        self._held: list[SSEEvent] | None = None
        self._since = 0.0
        self.held_s: float | None = None

    @property
    def holding(self) -> bool:
        return self._held is not None

    def feed(self, chunk: bytes, t: float = 0.0) -> bytes:
        """The bytes of ``chunk`` the client gets now (possibly with earlier held events)."""
        if self._held is None and passes_whole(self.parser, chunk):
            return chunk
        out: list[bytes] = []
        for e in self.parser.feed(chunk):
            if is_usage_only(e.data):
                out.extend(self._release(fingerprint_field(e.data), t))
            elif self._held is not None:
                self._held.append(e)
            elif finishes_without_fingerprint(e.data):
                self._held = [e]
                self._since = t
            else:
                out.append(e.raw)
        return b"".join(out)

    def _release(self, field: bytes | None, t: float) -> list[bytes]:
        held, self._held = self._held, None
        if held is None:
            return []
        self.held_s = (self.held_s or 0.0) + max(0.0, t - self._since)
        if field is None:
            return [e.raw for e in held]
        return [
            add_field(e.raw, field) if finishes_without_fingerprint(e.data) else e.raw for e in held
        ]

    def close(self, t: float = 0.0) -> bytes:
        """At the stream's end (or break): whatever is held, unchanged (no usage event came),
        then the bytes of an unfinished event."""
        return b"".join(self._release(None, t)) + self.parser.pending()
