"""The side-by-side HTML page of one pair: self-contained (inline CSS, no scripts), every
stored string escaped, the differing spans of the outputs wrapped in ``<mark>``."""

from __future__ import annotations

import json
from html import escape
from typing import Any

from api.models import Divergence, PairDetail, Side, Span

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.2em} h2{font-size:1.05em;margin-top:1.4em}
table{border-collapse:collapse} td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}
.cols{display:grid;grid-auto-flow:column;grid-auto-columns:1fr;gap:1em}
pre{white-space:pre-wrap;word-break:break-word;background:#f6f6f6;padding:.6em;margin:0}
mark{background:#ffd54f} mark.other{background:#ffab91} .muted{color:#777}
"""

ROLES = ("incumbent", "candidate", "replay")

PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
}
"""Headers of every HTML page the API serves: stored text can never run a script there."""


def _fmt(value: Any) -> str:
    if value is None:
        return '<span class="muted">-</span>'
    if isinstance(value, float):
        return f"{value * 1000:.1f} ms" if value < 100 else f"{value:.3f}"
    if isinstance(value, list):
        return escape(", ".join(str(v) for v in value)) or '<span class="muted">none</span>'
    return escape(str(value))


def marked(text: str | None, span: Span | None, css: str = "") -> str:
    """``text`` escaped, with ``text[span.start:span.end]`` (or the caret at ``start`` when
    the span is empty) in a ``<mark>``."""
    if text is None:
        return '<span class="muted">(no output)</span>'
    if span is None:
        return escape(text)
    cls = f' class="{css}"' if css else ""
    inner = escape(text[span.start : span.end]) or "&#8203;"
    return (
        f"{escape(text[: span.start])}"
        f'<mark{cls} data-first-divergence="{span.start}">{inner}</mark>'
        f"{escape(text[span.end :])}"
    )


def _timing_rows(sides: list[Side]) -> str:
    rows = [
        ("engine", lambda s: s.engine),
        (
            "status",
            lambda s: s.status if s.http_status is None else f"{s.status} ({s.http_status})",
        ),
        ("error", lambda s: s.error),
        ("finish reason", lambda s: s.finish_reason),
        ("TTFT", lambda s: s.ttft_s),
        ("TPOT", lambda s: s.tpot_s),
        ("E2E", lambda s: s.e2e_s),
        ("prompt tokens", lambda s: s.prompt_tokens),
        ("completion tokens", lambda s: s.completion_tokens),
        ("rewrites", lambda s: s.rewrites),
    ]
    return "\n".join(
        f"<tr><th>{label}</th>" + "".join(f"<td>{_fmt(get(s))}</td>" for s in sides) + "</tr>"
        for label, get in rows
    )


def margin_text(d: Divergence) -> str:
    """The logprob margin at the first divergence and what it makes of the divergence."""
    if d.margin is None:
        return (
            "logprob margin at the first divergence unknown (no logprobs there): counted as a"
            " hard divergence"
        )
    at_least = "at least " if d.margin_bound else ""
    verdict = (
        f"a near tie (within {d.near_tie_nats:g} nats: a flip a change of kernels makes)"
        if d.near_tie
        else f"a clear choice differs (hard: above {d.near_tie_nats:g} nats)"
        if d.near_tie is False
        else f"unknown whether within {d.near_tie_nats:g} nats: counted as hard"
    )
    return f"logprob margin at the first divergence {at_least}{d.margin:.3g} nats: {verdict}"


def _divergence_line(role: str, d: Divergence) -> str:
    parts = [
        "exact match: " + {True: "yes", False: "no", None: "n/a (sampled)"}[d.exact_match],
        "edit similarity " + ("n/a" if d.edit_similarity is None else f"{d.edit_similarity:.3f}"),
        f"first divergence at token {d.first_divergence} ({d.token_basis} tokens),"
        f" character {d.first_divergence_char}",
    ]
    if not d.comparable:
        parts = ["not comparable (a side failed or has no text)"]
    if d.finish_mismatch:
        parts.append("finish reasons differ")
    if d.diverged:
        parts.append(margin_text(d))
    if d.json_asked:
        parts.append(f"JSON valid: incumbent {d.json_valid_incumbent}, {role} {d.json_valid_other}")
    return f"<li><b>{escape(role)}</b> vs incumbent: {escape('; '.join(parts))}</li>"


def pair_page(detail: PairDetail) -> str:
    roles = [r for r in ROLES if r in detail.sides] + sorted(set(detail.sides) - set(ROLES))
    sides = [detail.sides[r] for r in roles]
    # The incumbent's column marks its span against the candidate (else the replay).
    ref = detail.divergence.get("candidate") or detail.divergence.get("replay")
    outputs = []
    for role, side in zip(roles, sides, strict=True):
        if role == "incumbent":
            body = marked(
                side.output_text, ref.highlight.incumbent if ref and ref.highlight else None
            )
        else:
            d = detail.divergence.get(role)
            span = d.highlight.other if d and d.highlight else None
            body = marked(side.output_text, span, "other")
        outputs.append(f"<div><h2>{escape(role)}</h2><pre>{body}</pre></div>")
    divergence = "".join(_divergence_line(r, d) for r, d in detail.divergence.items())
    prompt = json.dumps(detail.prompt, indent=2, ensure_ascii=False)
    params = json.dumps(detail.parameters, indent=2, ensure_ascii=False)
    title = f"pair {detail.pair_id}"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>
<style>{CSS}</style></head><body>
<h1>{escape(title)}</h1>
<p>deployment <b>{escape(detail.deployment)}</b> &middot; sent {escape(detail.sent_at.isoformat())}
&middot; {escape(detail.endpoint)} &middot; model {_fmt(detail.model)}</p>
<h2>Divergence</h2><ul>{divergence or "<li>no other role to compare</li>"}</ul>
<h2>Timings</h2>
<table><tr><th></th>{"".join(f"<th>{escape(r)}</th>" for r in roles)}</tr>
{_timing_rows(sides)}
</table>
<h2>Outputs</h2><div class="cols">{"".join(outputs)}</div>
<h2>Prompt</h2><pre>{escape(prompt)}</pre>
<h2>Parameters</h2><pre>{escape(params)}</pre>
</body></html>
"""
