"""Divergence of one pair, for the list of divergent pairs and the side-by-side view.

The figures (exact match, edit similarity, first divergence in tokens, finish mismatch, length
ratio, JSON validity, the logprob margin at the first divergence and whether it is a near tie)
come from :func:`evaluator.compare.compare_pair`, so the API and the report agree; the near-tie
margin is the deployment's stored policy's ``near_tie_nats`` (else the evaluator's default, 0.5),
as a review of it judges. This module adds what only a viewer needs: where in the *text*
the outputs part (:func:`highlight`), as character offsets a page can mark.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from api.models import Divergence, Highlight, Span
from evaluator.compare import NEAR_TIE_NATS, PairSide, compare_pair
from shadow_ab.privacy import is_digest


def common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def highlight(incumbent: str | None, other: str | None) -> Highlight | None:
    """The spans where two texts differ: after their common prefix, before their common
    suffix (the suffix never overlaps the prefix). None when the texts are equal."""
    a, b = incumbent or "", other or ""
    if a == b:
        return None
    start = common_prefix(a, b)
    room = min(len(a), len(b)) - start
    suffix = 0
    while suffix < room and a[len(a) - 1 - suffix] == b[len(b) - 1 - suffix]:
        suffix += 1
    return Highlight(
        incumbent=Span(start=start, end=len(a) - suffix),
        other=Span(start=start, end=len(b) - suffix),
    )


def near_tie_nats_of(policy: Any) -> float:
    """The near-tie margin of a deployment's stored policy (``deployments.policy``), else the
    evaluator's default."""
    value = policy.get("near_tie_nats") if isinstance(policy, Mapping) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 20:
        return float(value)
    return NEAR_TIE_NATS


def compare(
    incumbent: Mapping[str, Any],
    other: Mapping[str, Any],
    *,
    content: bool,
    near_tie_nats: float = NEAR_TIE_NATS,
) -> Divergence:
    """The divergence of ``other`` from ``incumbent`` (mappings of ``exchanges`` columns, the
    request taken from the incumbent's). Without ``content`` the divergent tokens are hidden."""
    request = incumbent.get("request") or {}
    inc = PairSide.from_row({**incumbent, "request": request})
    oth = PairSide.from_row({**other, "request": request})
    d = compare_pair(inc, oth, near_tie_nats=near_tie_nats)
    # Digests stand in for text (capture: metadata): there is no text to mark.
    mark = None if is_digest(inc.text) else highlight(inc.text, oth.text)
    return Divergence(
        comparable=d.comparable,
        greedy=d.greedy,
        diverged=d.diverged,
        exact_match=d.exact_match,
        edit_similarity=d.edit_similarity,
        first_divergence=d.first_divergence,
        first_divergence_char=mark.incumbent.start if mark else None,
        token_basis=d.token_basis,
        near_tie=d.near_tie,
        finish_reasons=list(d.finish_reasons),
        finish_mismatch=d.finish_mismatch,
        length_ratio=d.length_ratio,
        json_asked=d.json_asked,
        json_valid_incumbent=d.json_valid_incumbent,
        json_valid_other=d.json_valid_other,
        tokens=list(d.tokens),
        divergent_tokens=list(d.divergent_tokens) if content else None,
        highlight=mark,
        margin=d.margin,
        margin_bound=d.margin_bound,
        near_tie_nats=near_tie_nats,
    )
