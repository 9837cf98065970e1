"""One pair compared: how far one engine's answer is from the incumbent's (pure).

:func:`compare_pair` gives one pair's metrics, :class:`PairDivergence`, from two
:class:`PairSide` (build them with :meth:`PairSide.from_record` or :meth:`PairSide.from_row`).
No SQL and no aggregation here: :mod:`evaluator.divergence` runs it over a sample of a
deployment's pairs, the API (:mod:`api.divergence`) over one pair.

Per pair:

- tokens: the engine's own tokens when both sides carry logprobs, else a word/punctuation
  split of the text (``\\w+`` runs and single other non-space characters);
- ``exact_match``: identical text; judged only for greedy requests (``temperature`` 0, the
  semantics of :attr:`shadow_ab.records.ExchangeRecord.greedy`): sampled outputs differ by design;
- ``diverged``: a greedy pair whose texts differ;
- ``edit_similarity``: 1 - normalized Levenshtein distance over the tokens (rapidfuzz);
- ``first_divergence``: index of the first token that differs (the shorter length when one is a
  prefix of the other); None when the tokens agree;
- ``near_tie``: at the first divergence, each side's token is among the other side's top-k
  logprob alternatives (how vLLM's own tests judge two runs: a swap of near-equal candidates is
  not an error); None when either side has no alternatives there or one side ended there;
- ``finish_mismatch``, ``length_ratio`` (other / incumbent completion tokens) and, when the
  request asked for JSON (``response_format`` ``json_object`` / ``json_schema``), whether each
  side's text parses as JSON.

Records kept with ``capture: metadata`` (``mirror/privacy.py``) carry keyed digests instead of
text (``output_text`` is ``hmac-sha256:...``, each logprobs token a digest of the token). Equal
texts have equal digests, so ``exact_match`` and ``diverged`` hold as with text; with logprobs
(digested tokens) so do ``first_divergence``, ``edit_similarity`` and ``near_tie``
(``token_basis`` ``logprobs``); without them ``token_basis`` is ``digest`` and the token-level
figures and JSON validity are None. A pair with a digest on one side only is not comparable.

Errors: none raised for odd data; a pair where either side failed (status not ok, or no text)
is ``comparable=False`` with the metrics left None.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson
from rapidfuzz.distance import Levenshtein

from shadow_ab.privacy import is_digest
from shadow_ab.records import ExchangeRecord, TokenLogprob

_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)
JSON_FORMATS = frozenset({"json_object", "json_schema"})


@dataclass(frozen=True)
class PairSide:
    """One engine's answer as the comparison needs it."""

    text: str | None
    logprobs: Sequence[TokenLogprob] | None = None
    finish_reason: str | None = None
    completion_tokens: int | None = None
    status: str = "ok"
    request: Mapping[str, Any] = field(default_factory=dict)
    """The request body as sent (decides greedy and whether JSON was asked for)."""

    @classmethod
    def from_record(cls, rec: ExchangeRecord) -> PairSide:
        return cls(
            text=rec.output_text,
            logprobs=rec.logprobs,
            finish_reason=rec.finish_reason,
            completion_tokens=rec.completion_tokens,
            status=str(rec.status),
            request=rec.request,
        )

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> PairSide:
        """From an ``exchanges`` row (a mapping of its columns; ``logprobs`` as stored: a list
        of ``{"token", "logprob", "top"}`` objects)."""
        raw = row.get("logprobs")
        logprobs = None
        if raw:
            logprobs = [
                lp if isinstance(lp, TokenLogprob) else TokenLogprob.model_validate(lp)
                for lp in raw
            ]
        return cls(
            text=row.get("output_text"),
            logprobs=logprobs,
            finish_reason=row.get("finish_reason"),
            completion_tokens=row.get("completion_tokens"),
            status=str(row.get("status") or "ok"),
            request=row.get("request") or {},
        )

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.text is not None

    @property
    def greedy(self) -> bool:
        """Same rule as :attr:`ExchangeRecord.greedy`: temperature 0 (absent means 1.0)."""
        return is_greedy(self.request)

    @property
    def json_asked(self) -> bool:
        return json_asked(self.request)


def is_greedy(request: Mapping[str, Any]) -> bool:
    return float(request.get("temperature", 1.0) or 0.0) == 0.0


def json_asked(request: Mapping[str, Any]) -> bool:
    fmt = request.get("response_format")
    return isinstance(fmt, Mapping) and fmt.get("type") in JSON_FORMATS


def json_valid(text: str | None) -> bool:
    if text is None:
        return False
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


def text_tokens(text: str) -> list[str]:
    """Word runs and single punctuation characters: the tokens when no logprobs were kept."""
    return _TOKEN.findall(text)


@dataclass(frozen=True)
class PairDivergence:
    """One pair's divergence metrics (incumbent vs candidate, or incumbent vs replay)."""

    comparable: bool
    greedy: bool
    exact_match: bool | None = None
    """None when not comparable or not greedy (sampled outputs differ by design)."""
    diverged: bool = False
    """A comparable greedy pair whose texts differ."""
    edit_similarity: float | None = None
    first_divergence: int | None = None
    token_basis: str | None = None
    """"logprobs" (the engines' own tokens) or "text" (word/punctuation split)."""
    near_tie: bool | None = None
    finish_reasons: tuple[str | None, str | None] = (None, None)
    finish_mismatch: bool | None = None
    length_ratio: float | None = None
    json_asked: bool = False
    json_valid_incumbent: bool | None = None
    json_valid_other: bool | None = None
    tokens: tuple[int, int] = (0, 0)
    """Token counts (incumbent, other) on the comparison's basis."""
    divergent_tokens: tuple[str | None, str | None] = (None, None)
    """The two tokens at the first divergence (None where a side had ended)."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("finish_reasons", "tokens", "divergent_tokens"):
            d[key] = list(d[key])
        return d


def _tokens(side: PairSide, use_logprobs: bool) -> list[str]:
    if use_logprobs and side.logprobs is not None:
        return [lp.token for lp in side.logprobs]
    return text_tokens(side.text or "")


def first_difference(a: Sequence[str], b: Sequence[str]) -> int | None:
    """Index of the first element that differs (the shorter length for a strict prefix)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def near_tie_at(
    inc: Sequence[TokenLogprob] | None, other: Sequence[TokenLogprob] | None, pos: int
) -> bool | None:
    """Whether each side's token at ``pos`` is in the other side's top-k there; None when a
    side has no token or no alternatives at ``pos``."""
    if inc is None or other is None or pos >= len(inc) or pos >= len(other):
        return None
    a, b = inc[pos], other[pos]
    if not a.top or not b.top:
        return None
    return b.token in a.top and a.token in b.top


def compare_pair(incumbent: PairSide, other: PairSide) -> PairDivergence:
    """The divergence metrics of ``other`` (candidate or replay) against ``incumbent``."""
    greedy = incumbent.greedy
    if not (incumbent.ok and other.ok):
        return PairDivergence(comparable=False, greedy=greedy)
    digests = is_digest(incumbent.text), is_digest(other.text)
    if digests[0] != digests[1]:
        return PairDivergence(comparable=False, greedy=greedy)
    use_lp = bool(incumbent.logprobs) and bool(other.logprobs)
    if digests[0] and not use_lp:
        return _compare_digests(incumbent, other, greedy)
    ta, tb = _tokens(incumbent, use_lp), _tokens(other, use_lp)
    exact = incumbent.text == other.text
    first = None if exact else first_difference(ta, tb)
    if not exact and first is None:
        first = len(ta)  # the texts differ only in spacing the tokenization drops
    near = None
    divergent: tuple[str | None, str | None] = (None, None)
    if first is not None:
        divergent = (
            ta[first] if first < len(ta) else None,
            tb[first] if first < len(tb) else None,
        )
        if use_lp:
            near = near_tie_at(incumbent.logprobs, other.logprobs, first)
    similarity = float(Levenshtein.normalized_similarity(ta, tb)) if (ta or tb) else 1.0
    fa, fb = incumbent.finish_reason, other.finish_reason
    na = incumbent.completion_tokens if incumbent.completion_tokens is not None else len(ta)
    nb = other.completion_tokens if other.completion_tokens is not None else len(tb)
    asked = incumbent.json_asked
    return PairDivergence(
        comparable=True,
        greedy=greedy,
        exact_match=exact if greedy else None,
        diverged=greedy and not exact,
        edit_similarity=similarity,
        first_divergence=first,
        token_basis="logprobs" if use_lp else "text",
        near_tie=near,
        finish_reasons=(fa, fb),
        finish_mismatch=(fa != fb) if fa is not None and fb is not None else None,
        length_ratio=nb / na if na else None,
        json_asked=asked,
        json_valid_incumbent=json_valid(incumbent.text) if asked and not digests[0] else None,
        json_valid_other=json_valid(other.text) if asked and not digests[0] else None,
        tokens=(len(ta), len(tb)),
        divergent_tokens=divergent,
    )


def _compare_digests(incumbent: PairSide, other: PairSide, greedy: bool) -> PairDivergence:
    """Two answers known by their digests only (no text, no logprobs): whether they are equal,
    and what does not need the text."""
    exact = incumbent.text == other.text
    fa, fb = incumbent.finish_reason, other.finish_reason
    na, nb = incumbent.completion_tokens, other.completion_tokens
    return PairDivergence(
        comparable=True,
        greedy=greedy,
        exact_match=exact if greedy else None,
        diverged=greedy and not exact,
        edit_similarity=None,  # unknown without tokens (1.0 for equal ones would bias means)
        first_divergence=None,
        token_basis="digest",
        finish_reasons=(fa, fb),
        finish_mismatch=(fa != fb) if fa is not None and fb is not None else None,
        length_ratio=nb / na if na and nb is not None else None,
        json_asked=incumbent.json_asked,
        tokens=(na or 0, nb or 0),
    )
