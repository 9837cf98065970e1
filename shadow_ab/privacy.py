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
from collections.abc import Callable
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


def strip_credentials(value: Any, _path: str = "") -> tuple[Any, list[str]]:
    """``value`` without :data:`CREDENTIAL_KEYS` keys at any depth (a copy where something
    goes; the same object otherwise), and the dotted paths removed (``metadata.api_key``)."""
    if isinstance(value, dict):
        removed: list[str] = []
        out: dict[str, Any] | None = None
        for key, item in value.items():
            path = f"{_path}.{key}" if _path else str(key)
            if isinstance(key, str) and key.lower() in CREDENTIAL_KEYS:
                removed.append(path)
                if out is None:
                    out = {k: v for k, v in value.items()}
                del out[key]
                continue
            new, inner = strip_credentials(item, path)
            if inner:
                removed.extend(inner)
                if out is None:
                    out = {k: v for k, v in value.items()}
                out[key] = new
        return (value if out is None else out), removed
    if isinstance(value, list):
        removed = []
        items = list(value)
        changed = False
        for i, item in enumerate(value):
            new, inner = strip_credentials(item, f"{_path}[{i}]")
            if inner:
                removed.extend(inner)
                items[i] = new
                changed = True
        return (items if changed else value), removed
    return value, []


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
    left alone); a new object where something changed."""
    if isinstance(value, str):
        return redactor(value)
    if isinstance(value, dict):
        return {k: redact_strings(v, redactor) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_strings(v, redactor) for v in value]
    return value


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
