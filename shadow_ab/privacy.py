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
  every string of a JSON value; :func:`load_redactor` finds a redactor by name (``builtin``,
  ``none`` or ``module:function``).
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
from collections.abc import Callable, Iterator
from itertools import compress
from typing import Any

import orjson

# -- URLs ----------------------------------------------------------------------------------------

_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@'\"<>]*):[^/\s@'\"<>]*@")
MASK = "***"


def redact_url(url: object) -> str:
    """``url`` as text with the password of its user info (if any) replaced by ``***``."""
    return redact_urls(str(url))


def redact_urls(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` in it replaced."""
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

# Each kind has its own pattern, run only on texts holding a cheap sign of it ("@", "earer",
# a key prefix, a run of digits), so a long prompt without any costs a few substring scans.
_EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"
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
# a card number if 13-19 digits pass Luhn, else the phone patterns.
_DIGITS = re.compile(r"[0-9]{3}")
_NUMBER_RUN = re.compile(r"[0-9][0-9 ().-]{7,}[0-9]")
_CARD = re.compile(r"[0-9](?:[ -]?[0-9]){12,18}")
# International (+CC ...) or grouped national numbers: 9-15 digits with separators.
_PHONE = re.compile(
    r"(?<![\w+])\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]?\d{2,4}){2,4}\b"
    r"|(?<![\w+])\(\d{2,4}\)[ .-]?\d{3,4}[ .-]?\d{3,4}\b"
    r"|\b\d{3}[ .-]\d{3}[ .-]\d{4}\b"
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


def _numbers(text: str) -> str:
    """``text`` with card numbers and phone numbers among its digit runs replaced."""
    out: list[str] = []
    last = 0
    for m in _NUMBER_RUN.finditer(text):
        start, end = m.span()
        if start > 0 and text[start - 1] in "+(":
            start -= 1  # an international prefix or an area code in brackets
        if (start > 0 and (text[start - 1].isalnum() or text[start - 1] in "_+")) or (
            end < len(text) and (text[end].isalnum() or text[end] == "_")
        ):
            continue  # part of a word or a longer token: not a number of its own
        run = text[start:end]
        if _CARD.fullmatch(run) is not None and luhn_ok(run.replace(" ", "").replace("-", "")):
            new = "[CARD]"
        else:
            new = _PHONE.sub("[PHONE]", run)
        if new != run:
            out.append(text[last:start])
            out.append(new)
            last = end
    if not out:
        return text
    out.append(text[last:])
    return "".join(out)


def redact_text(text: str) -> str:
    """The built-in redactor: e-mail addresses, phone numbers, card numbers (Luhn), API keys
    and bearer tokens in ``text`` replaced by a label (``[EMAIL]``, ``[PHONE]``, ``[CARD]``,
    ``[API_KEY]``, ``Bearer [TOKEN]``).

    A pair's records share their prompt (the same string objects), so results for texts up to
    64 KiB are remembered for the next few calls: the prompt is scanned once per pair."""
    if len(text) < 6:
        return text
    if len(text) <= _CACHE_MAX_CHARS:
        return _redact_cached(text)
    return _redact(text)


_CACHE_MAX_CHARS = 64 * 1024


def _redact(text: str) -> str:
    if "@" in text:
        text = _EMAIL.sub("[EMAIL]", text)
    if "earer" in text:
        text = _BEARER.sub("Bearer [TOKEN]", text)
    if any(p in text for p in _KEY_PREFIXES):
        text = _APIKEY.sub("[API_KEY]", text)
    if _DIGITS.search(text) is not None:
        text = _numbers(text)
    return text


_redact_cached = functools.lru_cache(maxsize=64)(_redact)


def no_redaction(text: str) -> str:
    return text


def redact_strings(value: Any, redactor: Redactor) -> Any:
    """``value`` (any JSON value) with ``redactor`` applied to every string in it (keys are
    left alone), in document order; a new object for every object and array. Iterative: any
    depth."""
    if isinstance(value, str):
        return redactor(value)
    if not _is_container(value):
        return value
    if type(value) is list and _scalars_only(value):
        return list(value)
    out: Any = {} if type(value) is dict else []
    # (a copy being filled, the source's items still to copy into it)
    stack: list[tuple[Any, Iterator[tuple[Any, Any]]]] = [
        (out, iter(value.items()) if type(value) is dict else enumerate(value))
    ]
    while stack:
        dst, items = stack[-1]
        is_dict = type(dst) is dict
        for key, item in items:
            if isinstance(item, str):
                item = redactor(item)
            elif type(item) is dict or (type(item) is list and not _scalars_only(item)):
                copy: Any = {} if type(item) is dict else []
                if is_dict:
                    dst[key] = copy
                else:
                    dst.append(copy)
                stack.append((copy, iter(item.items()) if type(item) is dict else enumerate(item)))
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
