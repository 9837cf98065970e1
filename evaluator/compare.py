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
- ``margin`` and ``near_tie``: at the first divergence, how much more likely each side with
  logprobs found its own token than the token the other side continued with (nats, from that
  side's top alternatives; :func:`divergence_margin`); the pair's margin is the larger of the
  sides'. A near tie is a margin within ``near_tie_nats`` (0.5 by default): the engines' choice
  was a coin toss between near-equal tokens, which a change of kernels flips without being
  worse. Membership in a top-k list is not the test (a token 5 nats down can still be in the
  top 5). One side with logprobs is enough (the mirror asks the candidate and the replay for
  them, never the client's request, so the incumbent usually has none). None when unknown: no
  side has alternatives there, the divergence is where one side ended, or the other side's
  token is not among the alternatives and the least listed is within ``near_tie_nats``;
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
NEAR_TIE_NATS = 0.5
"""Default near-tie margin: the two tokens' logprobs within this many nats at the divergence."""


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
    margin: float | None = None
    """Logprob margin at the first divergence (nats; :func:`divergence_margin`), the larger of
    the sides'; a lower bound when ``margin_bound``. None when unknown."""
    margin_bound: bool = False
    """The margin is a lower bound: the other side's token was not among the alternatives."""

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


def common_prefix_len(a: str, b: str) -> int:
    """Characters two strings share at their start."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


Margin = tuple[float, bool]
"""(nats, is a lower bound)."""

MARGIN_SLACK = 1e-4
"""Nats a side's own token may fall below an alternative and still count as its greedy choice
(float rounding of a tie). Further below, the side did not pick its most likely token by the
logprobs it reported (penalties, or logprobs taken before processing): its margin says nothing,
and is unknown rather than a near tie."""


def _margin(value: float, bound: bool) -> Margin | None:
    if value < -MARGIN_SLACK:
        return None
    return max(0.0, value), bound


def side_margin(logprobs: Sequence[TokenLogprob], own: str, other: str) -> Margin | None:
    """How much more likely this side found its token at the first character where ``own`` and
    ``other`` differ than the token ``other`` continued with there, from this side's logprobs.

    The token covering the first differing character is found by the tokens' character offsets
    (they must concatenate to ``own``); the other side's token is the most likely alternative
    there that ``other`` continues with (a prefix of ``other`` from that token's start). None
    when the tokens do not spell ``own`` (byte-level pieces), when either text ends there (an
    end of sequence is not among the alternatives), when no alternatives were kept, or when this
    side's own token is below the other's by more than :data:`MARGIN_SLACK` (not its greedy
    choice). When the other's token is not among the alternatives, the margin is at least the
    distance to the least listed one: a lower bound."""
    if own == other:
        return None
    c = common_prefix_len(own, other)
    if c >= len(own) or c >= len(other):
        return None
    if "".join(t.token for t in logprobs) != own:
        return None
    # The decision is at the token covering the first differing character, or at the token
    # ending just before it when the other side's token there was a longer one (" the" against
    # " then"): own's alternatives that spell the other's text and not its own.
    start = 0
    ending: tuple[TokenLogprob, int] | None = None
    for lp in logprobs:
        end = start + len(lp.token)
        if end > c:
            break
        if end == c:
            ending = (lp, start)
        start = end
    else:
        return None
    for tok, at in (ending, (lp, start)) if ending else ((lp, start),):
        alts = _alternatives(tok, own[at:], other[at:])
        if alts:
            return _margin(tok.logprob - max(alts), False)
    if not lp.top:
        return None
    listed = [v for t, v in lp.top.items() if t != lp.token]
    if not listed:
        return None
    return _margin(lp.logprob - min(listed), True)


def _alternatives(lp: TokenLogprob, own: str, other: str) -> list[float]:
    """Logprobs of ``lp``'s listed alternatives that continue ``other`` and not ``own`` (texts
    from the token's start)."""
    return [
        v
        for t, v in lp.top.items()
        if t and t != lp.token and other.startswith(t) and not own.startswith(t)
    ]


def token_margin(own: TokenLogprob, other_token: str) -> Margin | None:
    """As :func:`side_margin` for aligned tokens (digested tokens: no text to align on)."""
    if not own.top:
        return None
    if other_token in own.top:
        return _margin(own.logprob - own.top[other_token], False)
    listed = [v for t, v in own.top.items() if t != own.token]
    return _margin(own.logprob - min(listed), True) if listed else None


def divergence_margin(
    incumbent: PairSide, other: PairSide, first: int | None = None, *, digests: bool = False
) -> Margin | None:
    """The pair's margin at the first divergence: the larger of the sides' (each side with
    logprobs judges from its own distribution); exact beats a bound of the same size. Texts
    are aligned by characters; digested texts, or tokens that do not spell their text when both
    sides have them, by token index ``first``."""
    found: list[Margin] = []
    a_lp, b_lp = incumbent.logprobs, other.logprobs
    if not digests:
        a, b = incumbent.text or "", other.text or ""
        for lps, own, oth in ((a_lp, a, b), (b_lp, b, a)):
            if lps:
                m = side_margin(lps, own, oth)
                if m is not None:
                    found.append(m)
    if not found and a_lp and b_lp and first is not None and first < min(len(a_lp), len(b_lp)):
        # Digested tokens, or tokens that do not spell the text: align them by index.
        for mine, theirs in ((a_lp[first], b_lp[first]), (b_lp[first], a_lp[first])):
            m = token_margin(mine, theirs.token)
            if m is not None:
                found.append(m)
    if not found:
        return None
    return max(found, key=lambda m: (m[0], not m[1]))


def judge_margin(margin: Margin | None, near_tie_nats: float) -> bool | None:
    """Near tie (True), not (False) or unknown (None: no margin, or a bound within reach)."""
    if margin is None:
        return None
    value, bound = margin
    if value > near_tie_nats:
        return False
    return None if bound else True


def compare_pair(
    incumbent: PairSide, other: PairSide, *, near_tie_nats: float = NEAR_TIE_NATS
) -> PairDivergence:
    """The divergence metrics of ``other`` (candidate or replay) against ``incumbent``; a near
    tie is a logprob margin within ``near_tie_nats`` at the first divergence."""
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
    margin: Margin | None = None
    divergent: tuple[str | None, str | None] = (None, None)
    if first is not None:
        divergent = (
            ta[first] if first < len(ta) else None,
            tb[first] if first < len(tb) else None,
        )
        margin = divergence_margin(incumbent, other, first, digests=digests[0])
    near = judge_margin(margin, near_tie_nats)
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
        margin=margin[0] if margin else None,
        margin_bound=margin[1] if margin else False,
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
