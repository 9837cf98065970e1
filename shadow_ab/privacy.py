"""Privacy helpers every part shares: passwords out of URLs, credentials out of JSON, private
text out of strings, keyed digests in place of text.

Pure functions (no part imported), used by the mirror before a record leaves it, by the query
API before an answer leaves it, and by every log line that names an engine:

- :func:`redact_url` / :func:`redact_urls`: ``http://user:PASSWORD@host`` becomes
  ``http://user:***@host``, in one URL or anywhere in a text (an exception's message, a log
  line). The one function for it: nothing else formats an engine URL for people to read.
- :data:`CREDENTIAL_KEYS`, :func:`strip_credentials`: JSON keys that hold credentials
  (``api_key``, ``authorization``, ``password``, ...), removed at any depth, with the dotted
  paths of what was removed.
- :func:`redact_text` (the built-in redactor): e-mail addresses, phone numbers, payment card
  numbers (Luhn-checked), API keys and bearer tokens replaced by ``[EMAIL]``, ``[PHONE]``,
  ``[CARD]``, ``[API_KEY]``, ``[TOKEN]``; :func:`redact_strings` applies a string function to
  every string of a JSON value, keys included; :func:`load_redactor` finds a redactor by
  name (``builtin``, ``none`` or ``module:function``); :func:`redact_tokens` redacts a list
  of tokens (logprobs) as their joined text, across token boundaries.
- :class:`Digester`: keyed digests (HMAC-SHA256) standing in for text where text is not kept
  (``capture: metadata``), so equal texts still compare equal and nothing can be read back
  from them, not even by trying likely texts, without the key.

Errors: :class:`ValueError` from :func:`load_redactor` (a sentence saying what to fix).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import importlib
import logging
import os
import re
import secrets
import traceback
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from itertools import compress
from typing import Any

import orjson

# -- URLs ----------------------------------------------------------------------------------------

# The password runs to the last "@" before the end of the authority (a "/", a space, a quote):
# a password may hold "@" (Python's URL parsers take the host after the last one), so a shorter
# match would show its tail. "@" further on, in the path, is not reached.
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@'\"<>]*):[^/\s'\"<>]*@")
MASK = "***"


def redact_url(url: object) -> str:
    """``url`` as text with the password of its user info (if any) replaced by ``***``."""
    return redact_urls(str(url))


def redact_urls(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` in it replaced, up to
    the last ``@`` before the host (``http://u:p@ss@host`` shows ``http://u:***@host``). A
    ``?`` or ``#`` before an ``@`` counts as part of the password (``http://host:80?to=a@b``
    shows ``http://host:***@b``): a little too much hidden rather than a password shown."""
    if "@" not in text:
        return text
    return _URL_PASSWORD.sub(lambda m: f"{m.group('head')}:{MASK}@", text)


# -- credentials in JSON ---------------------------------------------------------------------------

CREDENTIAL_KEYS = frozenset(
    {
        "api_key",
        "apikey",
        "api-key",
        "x-api-key",
        "x_api_key",
        "authorization",
        "proxy-authorization",
        "cookie",
        "set-cookie",
        "password",
        "passwd",
        "secret",
        "client_secret",
        "access_token",
        "refresh_token",
        "id_token",
        "private_key",
    }
)
"""JSON keys (compared case-insensitively) whose values are credentials, at any depth."""


_CONTAINERS = frozenset({dict, list})
_is_container_type = _CONTAINERS.__contains__


def _is_container(value: object) -> bool:
    return type(value) in _CONTAINERS


def strip_credentials(value: Any) -> tuple[Any, list[str]]:
    """``value`` without :data:`CREDENTIAL_KEYS` keys at any depth (a copy where something
    goes; the same object otherwise), and the dotted paths removed (``metadata.api_key``), in
    document order.

    Objects and arrays are plain ``dict`` and ``list`` (what JSON parsers make). Iterative, so
    any depth (a body nested 990 deep made the recursive version raise RecursionError); a path
    is spelled only for what is removed, and an array of scalars only (a prompt of a million
    token ids) is passed over in C."""
    removed: list[str] = []
    if not _is_container(value):
        return value, removed
    # A frame: [node, (key, item) still to visit, node's copy or None, key in parent]. A
    # child's copy goes into its parent's copy when the child is done; the stack's keys are
    # the path.
    root: list[Any] = [value, _items(value), None, None]
    stack = [root]
    while stack:
        frame = stack[-1]
        node, items = frame[0], frame[1]
        is_dict = type(node) is dict
        for key, item in items:
            if is_dict and isinstance(key, str) and key.lower() in CREDENTIAL_KEYS:
                removed.append(_path(stack, key))
                if frame[2] is None:
                    frame[2] = dict(node)
                del frame[2][key]
            elif type(item) is dict or (type(item) is list and not _scalars_only(item)):
                stack.append([item, _items(item), None, key])
                break
        else:
            stack.pop()
            if frame[2] is not None and stack:
                parent = stack[-1]
                if parent[2] is None:
                    parent[2] = dict(parent[0]) if type(parent[0]) is dict else list(parent[0])
                parent[2][frame[3]] = frame[2]
    return (value if root[2] is None else root[2]), removed


def _path(stack: list[list[Any]], last: str) -> str:
    """The dotted path of key ``last`` of the innermost frame (``tools[0].function.x``)."""
    parts: list[str] = []
    for frame, child in zip(stack, [*stack[1:], None], strict=True):
        key = last if child is None else child[3]
        if type(frame[0]) is list:
            parts.append(f"[{key}]")
        else:
            parts.append(f".{key}" if parts else str(key))
    return "".join(parts)


def _items(node: dict[Any, Any] | list[Any]) -> Iterator[tuple[Any, Any]]:
    """An object's (key, value) pairs; an array's (index, item) for its objects and arrays
    only, the scalars skipped in C."""
    if type(node) is dict:
        return iter(node.items())
    return compress(enumerate(node), map(_is_container_type, map(type, node)))


# -- private text in strings ---------------------------------------------------------------------

Redactor = Callable[[str], str]
Span = tuple[int, int, str]
"""``(start, end, replacement)``: ``text[start:end]`` becomes ``replacement``."""

# Each kind has its own pattern, run only on texts holding a cheap sign of it ("@", "earer",
# a key prefix, a digit: substring scans, no regex; then three digits in a row), so a long
# prompt without any costs a few scans of memory.
#
# The patterns run on a folded copy of the text, as long as it: compatibility forms the
# patterns need (full-width letters, digits, "@", ".", "-", "+", brackets; small forms; no-break
# and ideographic spaces) become their ASCII character by NFKC, and every other Unicode decimal
# digit (Arabic-Indic, Devanagari, mathematical, ...) its ASCII digit. What is replaced is the
# folded copy's span, in the original text; the rest of the text is kept as it was.
_FOLDED = re.compile(
    "[\u00a0\u2007\u2009\u202f\u3000\ufe52\ufe59\ufe5a\ufe62\ufe63\ufe6b\uff05\uff08-\uff0b"
    "\uff0d-\uff19\uff1d\uff20-\uff3a\uff3f\uff41-\uff5a\uff5e]"
)


def _fold_char(c: str) -> str:
    if c.isdecimal():
        return chr(48 + unicodedata.decimal(c))
    if _FOLDED.fullmatch(c) is not None:
        return unicodedata.normalize("NFKC", c)
    return c


def _fold(text: str) -> str:
    """``text`` with the characters above folded: the same length, itself when it has none.
    Its distinct characters are looked at (no regex scan of the text), then, when one folds,
    the text is translated once."""
    if text.isascii():
        return text
    chars = set(text)
    table = {ord(c): f for c in chars if not c.isascii() and (f := _fold_char(c)) != c}
    if not table:
        return text
    for c in chars:
        table.setdefault(ord(c), c)  # every character listed: no lookups that miss
    out = text.translate(table)
    return out if len(out) == len(text) else text  # one character for one, or not folded


# E-mail addresses, Unicode ones included (RFC 6531 local parts, IDN domains). _U: characters
# outside ASCII taken as letters: every one but spaces, punctuation and symbol blocks (Latin-1
# signs, general punctuation, arrows to miscellaneous symbols, CJK punctuation, surrogates and
# private use), so combining marks and every script's letters belong to the address. In a
# script written without spaces the letters right before an address are taken as part of it
# (more hidden, nothing shown).
_U = (
    "\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u1fff\u200c\u200d\u2070-\u218f\u2c00-\u2dff\u2e80-\u2fff"
    "\u3005-\u3007\u3021-\u3029\u3031-\u3035\u303b\u303c\u3040-\ud7ff\uf900-\ufe0f\ufe20-\ufe2f"
    "\ufe70-\ufefe\uff66-\uffef\U00010000-\U0010ffff"
)
_LOCAL = f"A-Za-z0-9._%+\\-{_U}"
_LABEL = f"A-Za-z0-9\\-{_U}"
_EMAIL = re.compile(
    f"(?<![{_LOCAL}])[{_LOCAL}]+@[{_LABEL}]+(?:\\.[{_LABEL}]+)*"
    f"\\.(?:xn--[A-Za-z0-9-]+|[A-Za-z]{{2,}}|[{_U}]{{2,}})"
)
_BEARER = re.compile(r"\b[Bb]earer\s+[A-Za-z0-9._~+/=-]{8,}")
# Prefixed keys of well-known providers, and JSON web tokens.
_KEY_PREFIXES = (
    "sk-", "pk-", "rk-", "sess-", "sk_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "xox", "AKIA",
    "AIza", "eyJ",
)  # fmt: skip
_APIKEY = re.compile(
    r"\b(?:sk|pk|rk|sess)-[A-Za-z0-9_-]{16,}"
    r"|\bsk_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|\bgh[pousr]_[A-Za-z0-9]{30,}"
    r"|\bxox[abposr]-[A-Za-z0-9-]{10,}"
    r"|\bAKIA[0-9A-Z]{16}\b"
    r"|\bAIza[0-9A-Za-z_-]{35}"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
)
# Runs of digits and separators long enough to be a phone or card number (the cheapest pattern
# that finds them: it starts on a plain character class); each run is then judged on its own:
# a card number if 13-19 digits pass Luhn (with dots only as group separators: a run with one
# dot is a decimal number), else the phone patterns.
_ASCII_DIGITS = "0123456789"
_DIGITS = re.compile(r"[0-9]{3}")
_NUMBER_RUN = re.compile(r"[0-9][0-9 ().-]{7,}[0-9]")
_CARD = re.compile(r"[0-9](?:[ .-]?[0-9]){12,18}")
_CARD_SEPARATORS = re.compile(r"[ .-]")
_WORD = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
# International (+CC ...) or grouped national numbers: 9-15 digits with separators; and bare
# digits: ten starting 2-9 (a North American number: area codes never start with 0 or 1, so
# Unix times in seconds, 1000000000-1999999999 until 2033, are not numbers of this shape), or
# eleven starting 1 and 2-9 (the same with its country code; a Chinese mobile number). Other
# bare runs of digits (ids, amounts, zero-led national numbers, other lengths) are kept: they are
# more often not phone numbers in a prompt; a phone number written with separators or "+" is.
_PHONE = re.compile(
    r"(?<![\w+])\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]?\d{2,4}){2,4}\b"
    r"|(?<![\w+])\(\d{2,4}\)[ .-]?\d{3,4}[ .-]?\d{3,4}\b"
    r"|\b\d{3}[ .-]\d{3}[ .-]\d{4}\b"
    r"|(?<![0-9.,])1?[2-9][0-9]{9}(?![0-9]|[.,][0-9])"
)


def luhn_ok(digits: str) -> bool:
    """Whether a string of digits passes the Luhn check (payment card numbers do)."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _number_spans(text: str) -> list[Span]:
    """Card numbers and phone numbers among the digit runs of ``text``."""
    spans: list[Span] = []
    for m in _NUMBER_RUN.finditer(text):
        start, end = m.span()
        if start > 0 and text[start - 1] in "+(":
            start -= 1  # an international prefix or an area code in brackets
        if (start > 0 and (text[start - 1] in _WORD or text[start - 1] == "+")) or (
            end < len(text) and text[end] in _WORD
        ):
            continue  # part of a word or a longer token: not a number of its own
        run = text[start:end]
        if (
            _CARD.fullmatch(run) is not None
            and run.count(".") != 1
            and luhn_ok(_CARD_SEPARATORS.sub("", run))
        ):
            spans.append((start, end, "[CARD]"))
        else:
            spans.extend(
                (start + p.start(), start + p.end(), "[PHONE]") for p in _PHONE.finditer(run)
            )
    return spans


def _found(pattern: re.Pattern[str], text: str, label: str) -> list[Span]:
    return [(m.start(), m.end(), label) for m in pattern.finditer(text)]


_PASSES: tuple[tuple[Callable[[str], bool], Callable[[str], list[Span]]], ...] = (
    (lambda t: "@" in t, lambda t: _found(_EMAIL, t, "[EMAIL]")),
    (lambda t: "earer" in t, lambda t: _found(_BEARER, t, "Bearer [TOKEN]")),
    (lambda t: any(p in t for p in _KEY_PREFIXES), lambda t: _found(_APIKEY, t, "[API_KEY]")),
    (lambda t: any(d in t for d in _ASCII_DIGITS) and _DIGITS.search(t) is not None, _number_spans),
)
"""The built-in redactor's passes, in order, each on the text the previous ones left."""


def splice(text: str, spans: list[Span]) -> str:
    """``text`` with each of ``spans`` (sorted, disjoint) replaced."""
    if not spans:
        return text
    out: list[str] = []
    last = 0
    for start, end, new in spans:
        out.append(text[last:start])
        out.append(new)
        last = end
    out.append(text[last:])
    return "".join(out)


def _compose(prior: list[Span], found: list[Span]) -> list[Span]:
    """Spans of a text whose splice is ``splice(splice(text, prior), found)``: ``prior`` in the
    text's positions, ``found`` in those of ``splice(text, prior)``."""
    out: list[Span] = []
    i = 0
    shift = 0  # the text's position minus the spliced text's, before prior[i]
    for s, e, new in found:
        while i < len(prior) and prior[i][0] - shift + len(prior[i][2]) <= s:
            ps, pe, pn = prior[i]
            out.append(prior[i])
            shift += (pe - ps) - len(pn)
            i += 1
        start = s + shift
        head = tail = ""
        end: int | None = None
        while i < len(prior) and prior[i][0] - shift < e:  # overlaps [s, e): merged into it
            ps, pe, pn = prior[i]
            at = ps - shift
            if at < s:
                start, head = ps, pn[: s - at]
            if at + len(pn) > e:
                end, tail = pe, pn[e - at :]
            shift += (pe - ps) - len(pn)
            i += 1
        out.append((start, e + shift if end is None else end, head + new + tail))
    out.extend(prior[i:])
    return out


def _redact_spans(text: str) -> tuple[str, list[Span]]:
    folded = _fold(text)
    current = folded
    spans: list[Span] = []
    for sign, find in _PASSES:
        if sign(current):
            found = find(current)
            if found:
                spans = _compose(spans, found) if spans else found
                current = splice(current, found)
    if not spans:
        return text, spans
    return (current if folded is text else splice(text, spans)), spans


_CACHE_MAX_CHARS = 64 * 1024
_redact_cached = functools.lru_cache(maxsize=64)(_redact_spans)


def _builtin_spans(text: str) -> tuple[str, list[Span]]:
    if len(text) < 6:
        return text, []
    if len(text) <= _CACHE_MAX_CHARS:
        return _redact_cached(text)
    return _redact_spans(text)


def redact_text(text: str) -> str:
    """The built-in redactor: e-mail addresses, phone numbers, card numbers (Luhn), API keys
    and bearer tokens in ``text`` replaced by a label (``[EMAIL]``, ``[PHONE]``, ``[CARD]``,
    ``[API_KEY]``, ``Bearer [TOKEN]``).

    E-mail addresses may be Unicode (``josé@example.com``, ``иван@пример.рф``) or IDN in ASCII
    (``xn--``). Phone numbers: international (``+`` and 8-15 digits, separators or not),
    grouped national ones (``(415) 555-2671``, ``415.555.2671``), and bare digits only in two
    shapes: ten starting 2-9 (``5551234567``, a North American number) or eleven starting 1
    and 2-9 (the same with its country code, or a Chinese mobile). Other bare digit runs are
    kept: in prompts they are mostly ids, amounts and times (a Unix time in seconds is ten
    digits starting with 1). Card numbers: 13-19 digits passing Luhn, grouped by spaces,
    dashes or dots (one dot alone makes a decimal number, kept). Full-width forms and other
    scripts' decimal digits count as their ASCII characters (NFKC, Unicode digit values) for
    the match; only the matched part of the text is replaced, the rest is kept as it was.

    A pair's records share their prompt (the same string objects), so results for texts up to
    64 KiB are remembered for the next few calls: the prompt is scanned once per pair."""
    return _builtin_spans(text)[0]


def _common_prefix(a: str, b: str, limit: int) -> int:
    lo, hi = 0, limit
    while lo < hi:  # by halves: slices compare in C
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(a: str, b: str, limit: int) -> int:
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid :] == b[len(b) - mid :]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def redaction_spans(text: str, redactor: Redactor) -> tuple[str, list[Span]]:
    """``redactor(text)``, and spans of ``text`` (sorted, disjoint) whose :func:`splice` gives
    it. The built-in redactor says where it replaced; any other is a black box: one span from
    its first changed character to its last, everything between taken as changed."""
    if redactor is redact_text:
        return _builtin_spans(text)
    new = redactor(text)
    if new == text:
        return new, []
    limit = min(len(text), len(new))
    head = _common_prefix(text, new, limit)
    tail = _common_suffix(text, new, limit - head)
    return new, [(head, len(text) - tail, new[head : len(new) - tail])]


def redact_tokens(tokens: Sequence[str], redactor: Redactor) -> tuple[list[str], list[bool]]:
    """``tokens`` (a generated text's tokens, in order) redacted as their joined text, across
    token boundaries: the same number of tokens, joined equal to ``redactor("".join(tokens))``,
    and for each whether it changed. A token where a replaced span starts takes the
    replacement (and keeps its own text outside the span); tokens further inside the span
    are emptied. The tokens' logprobs stay with them (the caller keeps them)."""
    text = "".join(tokens)
    _, spans = redaction_spans(text, redactor)
    if not spans:
        return list(tokens), [False] * len(tokens)
    out: list[str] = []
    changed: list[bool] = []
    k = 0
    end = 0
    for token in tokens:
        start, end = end, end + len(token)
        at = start
        parts: list[str] = []
        hit = False
        while k < len(spans) and spans[k][0] < end:
            s, e, new = spans[k]
            hit = True
            if s >= at:  # the span starts in this token
                parts.append(text[at:s])
                parts.append(new)
            if e > end:  # and goes on into the next
                at = end
                break
            at = e
            k += 1
        if hit:
            parts.append(text[at:end])
            out.append("".join(parts))
        else:
            out.append(token)
        changed.append(hit)
    return out, changed


def no_redaction(text: str) -> str:
    return text


def redact_strings(value: Any, redactor: Redactor) -> Any:
    """``value`` (any JSON value) with ``redactor`` applied to every string in it, object
    keys included (``{"alice@example.com": ...}`` is ``{"[EMAIL]": ...}``), in document order;
    a new object for every object and array. Iterative: any depth.

    Keys that redact to one key keep every value: the first takes the key, each later one
    the key with `` (2)``, `` (3)``, ... (the first number not already a key of that object),
    in the object's order."""
    if isinstance(value, str):
        return redactor(value)
    if not _is_container(value):
        return value
    if type(value) is list and _scalars_only(value):
        return list(value)
    out: Any = {} if type(value) is dict else []
    # (a copy being filled, its source, the source's items still to copy into it)
    stack: list[tuple[Any, Any, Iterator[tuple[Any, Any]]]] = [
        (out, value, iter(value.items()) if type(value) is dict else enumerate(value))
    ]
    while stack:
        dst, src, items = stack[-1]
        is_dict = type(dst) is dict
        for key, item in items:
            if is_dict:
                key = _redacted_key(key, redactor, dst, src)
            if isinstance(item, str):
                item = redactor(item)
            elif type(item) is dict or (type(item) is list and not _scalars_only(item)):
                copy: Any = {} if type(item) is dict else []
                if is_dict:
                    dst[key] = copy
                else:
                    dst.append(copy)
                items_of = iter(item.items()) if type(item) is dict else enumerate(item)
                stack.append((copy, item, items_of))
                break
            elif type(item) is list:
                item = list(item)  # numbers, booleans, nulls: copied in C
            if is_dict:
                dst[key] = item
            else:
                dst.append(item)
        else:
            stack.pop()
    return out


def _redacted_key(key: Any, redactor: Redactor, dst: dict[Any, Any], src: dict[Any, Any]) -> Any:
    """``key`` redacted, numbered past the keys ``dst`` already has (see redact_strings)."""
    if not isinstance(key, str):
        return key
    key = redactor(key)
    if key in dst:
        n = 2
        while f"{key} ({n})" in dst or f"{key} ({n})" in src:
            n += 1
        key = f"{key} ({n})"
    return key


def _scalars_only(items: list[Any]) -> bool:
    """Whether ``items`` holds no string, object or array (token ids, say): one C pass."""
    return not any(issubclass(t, _WALKED) for t in set(map(type, items)))


_WALKED = (str, dict, list)


BUILTIN = "builtin"
NONE = "none"


def load_redactor(spec: str) -> Redactor:
    """The redactor named by ``spec``: ``builtin`` (:func:`redact_text`), ``none``, or
    ``module:function`` naming a Python callable that takes a string and returns it redacted."""
    spec = spec.strip()
    if spec == BUILTIN:
        return redact_text
    if spec == NONE:
        return no_redaction
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"redactor {spec!r} is not 'builtin', 'none' or 'module:function' (a Python callable"
            " taking a string and returning it redacted)"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"redactor {spec!r}: cannot import {module_name!r} ({exc})") from None
    fn: Any = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ValueError(f"redactor {spec!r}: {module_name!r} has no {attr!r}")
    if not callable(fn):
        raise ValueError(f"redactor {spec!r}: {attr!r} is not callable")
    probe = fn("probe")
    if not isinstance(probe, str):
        raise ValueError(
            f"redactor {spec!r} must return a string (it returned {type(probe).__name__})"
        )
    redactor: Redactor = fn
    return redactor


# -- digests in place of text ----------------------------------------------------------------------

DIGEST_PREFIX = "hmac-sha256:"
"""What a digest standing in for a text starts with (``capture: metadata``)."""
TOKEN_DIGEST_PREFIX = "h:"


def is_digest(value: object) -> bool:
    """Whether ``value`` is a :class:`Digester` digest standing in for a text."""
    return isinstance(value, str) and value.startswith(DIGEST_PREFIX)


class Digester:
    """Keyed digests of texts and tokens. Equal inputs under one key give equal digests; without
    the key a digest says nothing about its text (a dictionary of likely texts does not help,
    as it would with a plain hash of "yes" or of one token).

    ``key`` None: a random key for this process only (the two sides of a pair are recorded by
    the same mirror process, so pairs still compare; digests of different processes do not)."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key if key else secrets.token_bytes(32)

    def text(self, value: str) -> str:
        """A digest of a whole text (128 bits, hex)."""
        mac = hmac.new(self._key, value.encode("utf-8", "surrogatepass"), hashlib.sha256)
        return DIGEST_PREFIX + mac.hexdigest()[:32]

    def token(self, value: str) -> str:
        """A short digest of one token (64 bits: enough to tell a top-k list's tokens apart)."""
        mac = hmac.new(self._key, value.encode("utf-8", "surrogatepass"), hashlib.sha256)
        return TOKEN_DIGEST_PREFIX + mac.hexdigest()[:16]

    def value(self, value: Any) -> str:
        """A digest of any JSON value (a prompt's ``messages`` list, say): of its canonical
        JSON text."""
        if isinstance(value, str):
            return self.text(value)
        return self.text(orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode())


# -- engines' error texts --------------------------------------------------------------------------

_ERROR_FIELDS = ("type", "code", "param")


def error_summary(text: str, why: str = "redacted") -> str:
    """An engine's error body without its message (engines echo the input there): the
    ``type``, ``code`` and ``param`` of an OpenAI-style error JSON, or only its length."""
    fields: dict[str, Any] = {}
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        obj = None
    if isinstance(obj, dict):
        nested = obj.get("error")
        inner: dict[str, Any] = nested if isinstance(nested, dict) else obj
        fields = {
            k: inner[k]
            for k in _ERROR_FIELDS
            if isinstance(inner.get(k), str | int) and not isinstance(inner.get(k), bool)
        }
    kept = " ".join(f"{k}={str(v)[:80]}" for k, v in fields.items())
    note = f"[message not kept: {why}; {len(text)} characters]"
    return f"{kept} {note}" if kept else note


# -- files holding private text --------------------------------------------------------------------


def private_opener(path: str, flags: int) -> int:
    """An ``opener`` for :func:`open` that creates files readable by their owner only (0600):
    ``open(path, "ab", opener=private_opener)``."""
    return os.open(path, flags, 0o600)


# -- logs ----------------------------------------------------------------------------------------


def install_log_redaction() -> None:
    """Make every log record of this process pass :func:`redact_urls` (message, arguments and
    traceback), whoever logs it: a URL with a password never reaches a log line. Idempotent."""
    factory = logging.getLogRecordFactory()
    if getattr(factory, "redacts_urls", False):
        return

    def make(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: leave it to the handler to report
            return record
        if "@" in message:
            record.msg, record.args = redact_urls(message), None
        if record.exc_info and record.exc_info[1] is not None:
            text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
            if "@" in text:
                record.exc_text = redact_urls(text)
        return record

    make.redacts_urls = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(make)
