"""A client's generate body, sized up before it is parsed: what a hostile body may cost the
mirror is bounded (issue 26).

:func:`inspect_body` takes the raw bytes of a ``/v1/chat/completions`` or ``/v1/completions``
body and returns an :class:`Inspected`: the parsed JSON object, or the reason it is not parsed
(one of :data:`REASONS`, usable as a Prometheus label value). A body refused here is still
forwarded to the incumbent unchanged; it is only not shadowed (the caller counts the reason).

Why: ``orjson.loads`` of a body within ``max_body_bytes`` (8 MiB) can build millions of Python
objects (``[{},{},...]``: 2.8 M dicts, ~550 MiB), and every later step on the event loop --
credential stripping, the candidate's rewrite, the record's redaction and encoding -- walks all
of them; one such body delayed every other client by seconds. So the body is measured first,
with a few linear passes of C code over the bytes and no Python object per element:

1. escaped backslashes and quotes removed (``\\\\`` then ``\\"``, left to right as a JSON lexer
   pairs them), then every byte but ``"{}[],`` deleted (``bytes.translate``);
2. the strings counted (quote pairs) and then cut out (one regex substitution), so brackets
   and commas inside text do not count;
3. containers (``{`` and ``[``) and values (commas + containers + 1: an upper bound) counted;
4. the nesting depth found by deleting innermost ``()`` pairs, one level per pass, at most
   :data:`MAX_DEPTH` + 1 passes, over brackets only (at most 2 x :data:`MAX_CONTAINERS` bytes).

Each count is checked before the next, more expensive step, so a hostile body costs at most
the passes over its bytes: nothing proportional to its element count is built in Python. The
counts are exact for valid JSON; for invalid JSON they may be anything, and orjson then says
``malformed`` (it validates everything the scan does not). Cost (CPU, a loaded 2-core box):
~2.2 ms for a 1 MiB chat body with tools, images and escaped quotes (orjson.loads of it:
~1.3-1.8 ms), ~65 ms to refuse 8 MiB of ``{},`` (orjson.loads: ~320 ms and 550 MiB), with at
most ~2x the body's size allocated.

Errors: none (every body gets an :class:`Inspected`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

import orjson

MAX_DEPTH: Final = 128
"""Deepest nesting of objects and arrays accepted. Real requests nest a few levels (a chat
message's content part's ``image_url`` is at depth 5); the deepest are JSON Schemas in
``tools`` and ``response_format`` (each object level of a schema is two JSON levels:
``properties`` then the property), which hand-written or generated schemas keep under ~30.
Above 128 nothing real is lost, and the bound keeps the request well inside what orjson can
write back (it refuses to encode more than 254 levels; a record adds one around the request)
and what recursive code can walk."""

MAX_CONTAINERS: Final = 20_000
"""Most objects and arrays accepted (every ``{`` and ``[`` outside strings). Containers are
what costs: an empty dict is 64 bytes of Python for 3 bytes of JSON, and every walk over the
request on the event loop (credentials, rewrite, redaction, encoding) visits each one. Real
bodies: a 1,000-turn conversation whose messages carry content parts and tool calls is ~5,000
containers, the 128 tools an OpenAI-style request may declare with their schemas ~2,000, a
batch of completions prompts one per prompt: 20,000 is over all of these together, and parses
and walks in tens of milliseconds."""

MAX_VALUES: Final = 1 << 18
"""Most JSON values accepted (an upper bound: commas + containers + 1 outside strings).
Scalars are cheap to parse and the walks pass arrays of them over in C, but a million of them
still cost ~60 ms of orjson on the event loop; 262,144 admits a ``/v1/completions`` prompt
given as token ids up to the 256 k-token context of the largest common served models and
stops ``[1,1,1,...]`` (4 M values in 8 MiB)."""

MAX_STRINGS: Final = 100_000
"""Most strings accepted (keys and values). Each string is a Python object and each value
string a call of the redactor when the record is made (~2.5 µs for a short one with the
built-in redactor). Real bodies: ~4-10 strings per message of a long conversation, ~40 per
tool declared: 100,000 is ten times a 1,000-turn conversation with 128 tools."""

MALFORMED: Final = "malformed"
"""Not JSON, or JSON but not an object."""
TOO_DEEP: Final = "too_deep"
TOO_MANY_CONTAINERS: Final = "too_many_containers"
TOO_MANY_VALUES: Final = "too_many_values"
TOO_MANY_STRINGS: Final = "too_many_strings"
REASONS: Final = (MALFORMED, TOO_DEEP, TOO_MANY_CONTAINERS, TOO_MANY_VALUES, TOO_MANY_STRINGS)
"""Why a body is not parsed (label values: each is a Prometheus label value as it is)."""

_KEEP = b'"{}[],'
_DROP: Final = bytes(b for b in range(256) if b not in _KEEP)
_STRING: Final = re.compile(rb'"[^"]*"')
_BRACKETS: Final = bytes.maketrans(b"{[}]", b"(())")
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"{}[]")


@dataclass(frozen=True, slots=True)
class Inspected:
    """What :func:`inspect_body` found: ``body`` (the parsed object) when the body is within
    the limits and a JSON object, else ``reason`` (one of :data:`REASONS`). Exactly one of the
    two is None."""

    body: dict[str, Any] | None
    reason: str | None = None


def inspect_body(body: bytes) -> Inspected:
    """The JSON object in ``body``, or why it is not parsed (see the module's docstring)."""
    reason = _over_limits(body)
    if reason is not None:
        return Inspected(None, reason)
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return Inspected(None, MALFORMED)
    if not isinstance(obj, dict):
        return Inspected(None, MALFORMED)
    return Inspected(obj)


def _over_limits(body: bytes) -> str | None:
    """The first limit ``body`` exceeds, or None (a few passes of C code; see the module)."""
    if b'\\"' in body:  # else no quote follows a backslash: every quote is a delimiter
        if b"\\\\" in body:
            body = body.replace(b"\\\\", b"")
        body = body.replace(b'\\"', b"")
    kept = body.translate(None, _DROP)
    quotes = kept.count(b'"')
    if quotes % 2:
        return MALFORMED  # an unterminated string
    if quotes // 2 > MAX_STRINGS:
        return TOO_MANY_STRINGS
    outside = kept
    if quotes:
        # Adjacent quotes are an empty string or two strings with only deleted bytes between
        # them (``"a":"b"``): removing them leaves what is outside strings as it was, and
        # most strings, with nothing kept inside, go at C speed; the regex takes the rest.
        outside = _STRING.sub(b"", kept.replace(b'""', b""))
    containers = outside.count(b"{") + outside.count(b"[")
    if containers > MAX_CONTAINERS:
        return TOO_MANY_CONTAINERS
    if outside.count(b",") + containers + 1 > MAX_VALUES:
        return TOO_MANY_VALUES
    if containers > MAX_DEPTH:
        # One pass per level: each removes every innermost pair, so the deepest path loses
        # exactly one level. Bracket kinds are merged (a mismatch is orjson's to report).
        nest = outside.translate(_BRACKETS, _NOT_BRACKETS)
        for _ in range(MAX_DEPTH):
            shorter = nest.replace(b"()", b"")
            if not shorter or len(shorter) == len(nest):
                return None  # at most MAX_DEPTH levels, or unbalanced (orjson: malformed)
            nest = shorter
        return TOO_DEEP
    return None
