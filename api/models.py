"""Response models of the query API (pydantic), so the OpenAPI document is precise.

Fields that carry prompt or output text are ``None`` unless the token has the ``content`` scope
(:mod:`api.auth`); the model says so in each field's description.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

CONTENT_NOTE = " Null unless the token has the `content` scope."


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True)


class Problem(_Out):
    """An error, as RFC 9457 problem details."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    errors: list[dict[str, Any]] | None = None


def problem_response(description: str) -> dict[str, Any]:
    """An OpenAPI response entry for a :class:`Problem` served as application/problem+json."""
    ref = {"$ref": "#/components/schemas/Problem"}
    return {
        "model": Problem,
        "description": description,
        "content": {"application/problem+json": {"schema": ref}},
    }


class Health(_Out):
    status: Literal["ok", "unavailable"]
    database: str = Field(description="`ok`, or why the store cannot be reached")


class DeploymentSummary(_Out):
    name: str
    incumbent_engine: str | None
    incumbent_version: str | None
    candidate_engine: str | None
    candidate_version: str | None
    model: str | None
    hardware: str | None
    started_at: datetime | None
    ended_at: datetime | None
    created_at: datetime


class DeploymentList(_Out):
    items: list[DeploymentSummary]


class ReportSummary(_Out):
    id: int
    deployment: str
    created_at: datetime
    window_from: datetime
    window_to: datetime
    verdict: str = Field(description="GO, NO-GO or INCONCLUSIVE")
    has_html: bool = Field(description="whether `?format=html` has a page to show")


class Deployment(DeploymentSummary):
    policy: dict[str, Any] | None
    reports: int = Field(description="how many reports are stored")
    incidents: int = Field(description="how many incidents are stored")
    latest_report: ReportSummary | None


class ReportList(_Out):
    deployment: str
    items: list[ReportSummary]


class Report(ReportSummary):
    body: dict[str, Any] = Field(
        description="the review as the evaluator stored it (sections, criteria, verdict);"
        " text fields holding prompts or outputs are null unless the token has `content`"
    )


class _Passthrough(_Out):
    """Shapes computed by the evaluator: keys it adds later pass through unchanged."""

    model_config = ConfigDict(frozen=True, extra="allow")


class Incident(_Passthrough):
    id: int
    deployment: str
    engine: str = Field(description="engine id, e.g. `trtllm@candidate`")
    role: str | None = Field(description="incumbent, candidate or replay, when known")
    kind: str = Field(description="crash, version_change, leak, error_burst or hang")
    started_at: datetime
    ended_at: datetime | None
    duration_s: float | None
    evidence: dict[str, Any]
    detected_at: datetime | None


class IncidentList(_Out):
    deployment: str
    engine_role: str | None
    kind: str | None
    since: datetime | None
    until: datetime | None
    items: list[Incident]


UNBOUNDED = " Null when infinite or undefined (JSON has no infinity)."


class RateInterval(_Passthrough):
    low: float | None
    high: float | None = Field(description="upper bound." + UNBOUNDED)
    level: float


class RateComparison(_Passthrough):
    """Candidate (x1 incidents over t1 observed days) against incumbent (x2 over t2): exact
    conditional binomial test and interval of the rate ratio."""

    x1: int
    t1: float
    x2: int
    t2: float
    rate1: float
    rate2: float
    ratio: float | None = Field(description="rate1 / rate2." + UNBOUNDED)
    interval: RateInterval
    p_value: float
    method: str


class RoleIncidents(_Passthrough):
    engines: list[str]
    count: int
    counts: dict[str, int] = Field(description="per kind")
    exposure_days: float = Field(description="days the role was observed")
    rate_per_day: float | None


class BucketRole(_Passthrough):
    counts: dict[str, int] = Field(description="per kind")
    total: int
    exposure_days: float
    rate_per_day: float | None


class IncidentBucket(_Passthrough):
    bucket: str = Field(description="2026-11-30 or 2026-W49")
    start: datetime
    incumbent: BucketRole
    candidate: BucketRole
    comparison: RateComparison | None


class IncidentComparison(_Passthrough):
    """Incident counts per day or ISO week per role, rates per observed day, and the exact
    candidate / incumbent rate comparison: what `shadow-ab incidents` shows, from
    `evaluator.incidents.query.compare_incidents`."""

    deployment: str
    by: Literal["day", "week"]
    kind: str | None
    kinds: list[str]
    since: datetime
    until: datetime
    roles: dict[str, RoleIncidents]
    comparison: RateComparison | None
    buckets: list[IncidentBucket]


class Timings(_Out):
    ttft_s: float | None = Field(description="time to first token (seconds)")
    e2e_s: float | None = Field(description="send to last token (seconds)")
    tpot_s: float | None = Field(description="time per output token after the first (seconds)")


class SideSummary(Timings):
    role: str
    engine: str
    status: str
    finish_reason: str | None
    completion_tokens: int | None
    output_text: str | None = Field(description="the engine's answer." + CONTENT_NOTE)


class Span(_Out):
    """``text[start:end]`` (Python string offsets, i.e. Unicode code points)."""

    start: int
    end: int


class Highlight(_Out):
    """Where the two outputs stop agreeing: the common prefix ends at ``incumbent.start`` ==
    ``other.start``; each side's span runs to where the common suffix begins."""

    incumbent: Span
    other: Span


class Divergence(_Out):
    """How far ``other`` (candidate or replay) drifted from the incumbent: the figures of
    ``evaluator.compare.compare_pair`` plus the character offsets of the difference."""

    comparable: bool = Field(description="both sides answered ok with text")
    greedy: bool = Field(description="temperature 0: exact match is meaningful")
    diverged: bool = Field(description="a comparable greedy pair whose texts differ")
    exact_match: bool | None = Field(description="identical text; null unless greedy")
    edit_similarity: float | None = Field(description="1 - normalized token edit distance")
    first_divergence: int | None = Field(description="token index of the first difference")
    first_divergence_char: int | None = Field(
        description="character offset of the first difference"
    )
    token_basis: str | None = Field(description="`logprobs` (engine tokens) or `text` (words)")
    near_tie: bool | None = Field(
        description="the logprob margin at the first divergence is within `near_tie_nats`: the"
        " engines' top two tokens were nearly tied, which a change of kernels flips (not worse);"
        " false: a clear choice differs; null when the margin is unknown (no logprobs there)"
    )
    finish_reasons: list[str | None] = Field(description="(incumbent, other)")
    finish_mismatch: bool | None
    length_ratio: float | None = Field(description="other / incumbent completion tokens")
    json_asked: bool = Field(description="the request asked for JSON output")
    json_valid_incumbent: bool | None
    json_valid_other: bool | None
    tokens: list[int] = Field(description="token counts (incumbent, other)")
    divergent_tokens: list[str | None] | None = Field(
        description="the two tokens at the first divergence." + CONTENT_NOTE
    )
    highlight: Highlight | None = Field(description="the differing spans; null when equal")
    margin: float | None = Field(
        default=None,
        description="logprob margin at the first divergence, in nats: how much more likely a"
        " side found its own token than the one the other side continued with (the larger of"
        " the two sides'); null when unknown",
    )
    margin_bound: bool = Field(
        default=False,
        description="the margin is a lower bound (the other token was not among the top"
        " logprobs listed)",
    )
    near_tie_nats: float = Field(
        default=0.5,
        description="the near-tie margin judged against: the deployment's policy's"
        " near_tie_nats, else 0.5",
    )


class DivergentPair(_Out):
    pair_id: uuid.UUID
    sent_at: datetime
    endpoint: str
    model: str | None
    incumbent: SideSummary
    other: SideSummary
    divergence: Divergence


class PairPage(_Out):
    deployment: str
    against: Literal["candidate", "replay"]
    limit: int
    items: list[DivergentPair]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null at end")


class Side(Timings):
    role: str
    engine: str
    sent_at: datetime
    status: str
    http_status: int | None
    error: str | None
    stream: bool
    itl_s: list[float] = Field(description="gaps between token events (seconds)")
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str | None
    rewrites: list[str] = Field(description="request rewrites the mirror applied for this engine")
    inflight_incumbent: int | None
    inflight_candidate: int | None
    guard: dict[str, Any]
    output_text: str | None = Field(description="the engine's answer." + CONTENT_NOTE)
    logprobs: list[dict[str, Any]] | None = Field(description="per token logprobs." + CONTENT_NOTE)


class PairDetail(_Out):
    pair_id: uuid.UUID
    deployment: str
    sent_at: datetime
    endpoint: str
    model: str | None
    prompt: Any = Field(description="`messages` or `prompt` of the request." + CONTENT_NOTE)
    parameters: dict[str, Any] = Field(description="the request's other fields (sampling, ...)")
    sides: dict[str, Side] = Field(description="by role: incumbent, candidate, replay")
    divergence: dict[str, Divergence] = Field(
        description="by role (candidate, replay): compared with the incumbent"
    )
