"""What of a request's and an answer's text a record keeps: the capture modes and the redactor.

Every exchange record passes through :meth:`Privacy.apply` before it leaves the mirror (in
:meth:`mirror.recorder.Recorder.record`, after the client's answer is complete). The level is the
deployment's ``privacy.capture``, lowered (never raised) per request by the opt-out header
(``x-shadow-capture: metadata`` or ``none``; any other value counts as ``none``):

- ``full``: the request body (credential-like keys removed at any depth), ``output_text`` and
  ``error``, each string passed through the redactor (``privacy.redactor``: ``builtin`` replaces
  e-mail addresses, phone and card numbers, API keys and bearer tokens; ``none``; or a Python
  callable ``module:function``, string in, string out), and the logprobs, their tokens
  redacted as their joined text (so an address split over tokens is found; the tokens then
  join to the redacted output; alternatives at a changed token become ``[REDACTED n]``;
  logprob values kept).
- ``metadata``: no text. The request keeps its sampling parameters (model, temperature,
  max_tokens, ...); each field that carries text (``messages``, ``prompt``, ``tools``, ``user``,
  ...) is replaced by a keyed digest (HMAC-SHA256, :class:`shadow_ab.privacy.Digester`);
  ``output_text`` is the digest of the answer, and each logprobs token (and top alternative) a
  digest of the token, numbers kept. Equal texts have equal digests under one key, so a pair's
  exact match, first divergence and token edit similarity are still computed
  (``evaluator.compare``); nothing can be read back. An engine's error body (engines echo the
  input) keeps only its type and code.
- ``none``: as ``metadata`` without any digest: timings, statuses, token counts, parameters.

The level is recorded in ``rewrites`` (``capture:metadata``, ``capture:none``) so readers know
``output_text`` is a digest or absent. Mirror-made error texts (timeouts, connection errors)
always go through :func:`shadow_ab.privacy.redact_urls` (no password of an engine URL).

Errors: :class:`RedactionError` when the configured redactor raises (the record is dropped and
counted rather than kept unredacted).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mirror.errors import RedactionError
from shadow_ab.privacy import (
    Digester,
    Redactor,
    error_summary,
    load_redactor,
    no_redaction,
    redact_strings,
    redact_tokens,
    redact_urls,
    strip_credentials,
)
from shadow_ab.records import ExchangeRecord, Status, TokenLogprob

CaptureLevel = Literal["full", "metadata", "none"]
FULL: CaptureLevel = "full"
METADATA: CaptureLevel = "metadata"
NONE: CaptureLevel = "none"
_RANK = {NONE: 0, METADATA: 1, FULL: 2}

PARAMETER_KEYS = frozenset(
    {
        "model",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "max_tokens",
        "max_completion_tokens",
        "min_tokens",
        "n",
        "best_of",
        "stream",
        "stream_options",
        "seed",
        "logprobs",
        "top_logprobs",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "length_penalty",
        "ignore_eos",
        "echo",
        "skip_special_tokens",
        "parallel_tool_calls",
    }
)
"""Request fields that are parameters, not text: kept whatever the capture level."""


REDACTION_BUDGET: Final = 1 << 20
"""Characters of a record's request the redactor is given at most (each string counts its
length plus :data:`REDACTION_STRING_COST`); the strings past it are replaced by
:data:`OVER_BUDGET`, never kept unredacted. The built-in redactor runs at 15-120 ns a
character (prose; dense digits or e-mail addresses) and ~2.5 µs a short string, on the event
loop when the record is made: 1 Mi characters is at most ~0.1 s a record, where a body of
520,000 short e-mail addresses took 1.3 s (issue 26). Real prompts are under it: 1 Mi
characters is ~250 k tokens of English, past the context of most served models."""

REDACTION_STRING_COST: Final = 32
"""What a string costs of :data:`REDACTION_BUDGET` besides its characters: the redactor's
fixed cost per call (~2.5 µs, the time of ~30 characters of dense text)."""

OVER_BUDGET: Final = "[NOT KEPT: over the redaction budget]"
"""Stands in for each string of a request past :data:`REDACTION_BUDGET`."""

REWRITE_OVER_BUDGET: Final = "redaction:over_budget"
"""In ``rewrites`` of a record some of whose request strings are :data:`OVER_BUDGET`."""


class _Budgeted:
    """A redactor that gives up, for a marker, past a budget of characters (one per record)."""

    __slots__ = ("left", "over", "redact")

    def __init__(self, redact: Redactor, budget: int) -> None:
        self.redact = redact
        self.left = budget
        self.over = False

    def __call__(self, text: str) -> str:
        self.left -= len(text) + REDACTION_STRING_COST
        if self.left < 0:
            self.over = True
            return OVER_BUDGET
        return self.redact(text)


OPT_OUT_HEADER = b"x-shadow-capture"
"""The request header that lowers a request's capture level (``metadata`` or ``none``); a
setting (``privacy.opt_out_header``) until issue 26: one name the clients and docs can rely on."""


class PrivacyConfig(BaseModel):
    """``privacy:`` in the mirror's YAML (``SHADOW_AB_MIRROR_PRIVACY__CAPTURE=metadata``, ...)."""

    model_config = ConfigDict(extra="forbid")

    capture: CaptureLevel = Field(
        default=FULL,
        description="full: text kept (redacted); metadata: timings, counts and keyed digests"
        " only; none: no text and no digests",
    )
    redactor: str = Field(
        default="builtin",
        description="run on every string of a record kept with text: builtin, none, or a"
        " Python callable module:function (str -> str)",
    )
    hash_key_file: Path | None = Field(
        default=None,
        description="file holding the key of the digests (metadata mode; a mounted Secret);"
        " default: a random key per process (pairs compare, digests of different processes"
        " do not)",
    )

    @field_validator("redactor")
    @classmethod
    def _loadable(cls, v: str) -> str:
        load_redactor(v)
        return v.strip()

    @field_validator("hash_key_file")
    @classmethod
    def _readable(cls, v: Path | None) -> Path | None:
        if v is not None and not os.access(v, os.R_OK):
            raise ValueError(f"cannot read the digest key file {v}")
        return v

    def key(self) -> bytes | None:
        if self.hash_key_file is not None:
            return self.hash_key_file.read_bytes().strip() or None
        return None


class Privacy:
    """Applies a :class:`PrivacyConfig` to records (one per mirror)."""

    def __init__(self, config: PrivacyConfig) -> None:
        self.config = config
        self.level = config.capture
        self.header = OPT_OUT_HEADER
        self.redactor = load_redactor(config.redactor)
        self.digester = Digester(config.key())

    def level_for(self, value: bytes | None) -> CaptureLevel:
        """The capture level of a request whose opt-out header has ``value`` (None: absent)."""
        if value is None:
            return self.level
        asked = value.decode("latin-1").strip().lower()
        level: CaptureLevel = NONE
        if asked in (METADATA, FULL):
            level = METADATA if asked == METADATA else FULL
        return level if _RANK[level] < _RANK[self.level] else self.level

    def apply(self, record: ExchangeRecord, level: str) -> ExchangeRecord:
        """``record`` as it may leave the mirror at capture ``level``."""
        try:
            if level == FULL:
                return self._full(record)
            return self._reduced(record, digests=level == METADATA, level=level)
        except RedactionError:
            raise
        except Exception as exc:
            # The exception's type only: its message may quote the text being redacted.
            raise RedactionError(f"{type(exc).__name__} in {self.config.redactor}") from None

    def _full(self, record: ExchangeRecord) -> ExchangeRecord:
        redact = self.redactor
        request, _ = strip_credentials(record.request)
        error = redact_urls(record.error) if record.error else record.error
        if redact is no_redaction:
            if request is record.request and error == record.error:
                return record
            return record.model_copy(update={"request": request, "error": error})
        # The answer's text, tokens and error (bounded by the engine's output and
        # ERROR_MAX_CHARS) are always redacted; the request, the client's to size, within the
        # budget.
        budgeted = _Budgeted(redact, REDACTION_BUDGET)
        update: dict[str, Any] = {
            "request": redact_strings(request, budgeted),
            "output_text": redact(record.output_text) if record.output_text else None,
            "error": redact(error) if error else error,
            "logprobs": _redact_logprobs(record.logprobs, redact),
        }
        if budgeted.over:
            update["rewrites"] = [*record.rewrites, REWRITE_OVER_BUDGET]
        return record.model_copy(update=update)

    def _reduced(self, record: ExchangeRecord, *, digests: bool, level: str) -> ExchangeRecord:
        dg = self.digester
        request: dict[str, Any] = {}
        for key, value in record.request.items():
            if key in PARAMETER_KEYS:
                request[key] = value
            elif key == "response_format" and isinstance(value, dict):
                request[key] = {"type": value.get("type")}
            elif digests and value is not None:
                request[key] = dg.value(value)
        output = record.output_text
        logprobs = record.logprobs
        if digests:
            output = dg.text(output) if output is not None else None
            if logprobs is not None:
                logprobs = [_digest_token(lp, dg) for lp in logprobs]
        else:
            output, logprobs = None, None
        error = record.error
        if error:
            error = (
                error_summary(error, level)
                if record.status is Status.HTTP_ERROR
                else redact_urls(error)
            )
        return record.model_copy(
            update={
                "request": request,
                "output_text": output,
                "logprobs": logprobs,
                "error": error,
                "rewrites": [*record.rewrites, f"capture:{level}"],
            }
        )


REDACTED_ALTERNATIVE = "[REDACTED {n}]"
"""What a top alternative is renamed to at a token the redactor changed (``n`` from 1)."""


def _redact_logprobs(logprobs: list[Any] | None, redact: Redactor) -> list[Any] | None:
    """``logprobs`` with their tokens redacted as the joined text (:func:`redact_tokens`: an
    address split over tokens is found, and the tokens then join to the redacted output). At
    a changed token, its own entry among the alternatives follows its new text and every
    other alternative becomes ``[REDACTED n]`` (they would spell the rest of the secret);
    every logprob value and the number of alternatives are kept, so margins still work."""
    if not logprobs:
        return logprobs
    items = [TokenLogprob.model_construct(**lp) if isinstance(lp, dict) else lp for lp in logprobs]
    tokens, changed = redact_tokens([lp.token for lp in items], redact)
    if not any(changed):
        return logprobs
    out: list[Any] = []
    for lp, token, hit in zip(items, tokens, changed, strict=True):
        if not hit:
            out.append(lp)
            continue
        top: dict[str, float] = {}
        if lp.token in lp.top:
            top[token] = lp.top[lp.token]
        n = 0
        for alt, value in lp.top.items():
            if alt == lp.token:
                continue
            n += 1
            while (key := REDACTED_ALTERNATIVE.format(n=n)) in top:
                n += 1
            top[key] = value
        out.append(TokenLogprob.model_construct(token=token, logprob=lp.logprob, top=top))
    return out


def _digest_token(lp: Any, dg: Digester) -> TokenLogprob:
    if isinstance(lp, dict):
        lp = TokenLogprob.model_construct(**lp)
    return TokenLogprob.model_construct(
        token=dg.token(lp.token),
        logprob=lp.logprob,
        top={dg.token(k): v for k, v in lp.top.items()},
    )
