"""Request rewriting: what each engine is sent, derived from the client's JSON body.

Pure functions on plain dicts (the body is never mutated; a rewritten copy is returned together
with the names of the rewrites, which go into ``ExchangeRecord.rewrites``):

- :func:`candidate_request`: credential-like fields removed at any depth (``credential:<path>``),
  then the candidate-specific rewrites of :class:`CandidateRewrite` -- model-name mapping
  (``model``), fields the candidate rejects (``drop:<field>``; TensorRT-LLM answers 400 to
  fields it does not know), an explicit ``max_tokens`` where the client left it out
  (``max_tokens``; completions: :data:`COMPLETIONS_MAX_TOKENS`, what the vLLM incumbent
  applied), and
  ``stream_options.include_usage`` on streams so the token count (hence TPOT) is known.
- :func:`with_stream_usage`: ``include_usage`` for the incumbent's stream too; the mirror then
  hides the usage chunk from a client that did not ask for it (and gives the finish chunks back
  the ``system_fingerprint`` vLLM moved onto it: :class:`mirror.sse.UsageHider`).
- :func:`with_top_logprobs`: top logprobs for the candidate and the replay where the client did
  not ask for them (``logprobs``): the evaluator's near-tie margin needs the alternatives at the
  first divergence. Never applied to the client's request.
- :func:`stored_request`: the body as kept in the store, without credential-like fields
  (headers -- Authorization, API keys, cookies -- are never stored at all).

Errors: none.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from shadow_ab.privacy import CREDENTIAL_KEYS, strip_credentials

INCLUDE_USAGE = "stream_options.include_usage"
MAX_TOKENS = "max_tokens"
MODEL = "model"
CREDENTIAL = "credential"
LOGPROBS = "logprobs"
CACHE_SALT = "cache_salt"

ANY_MODEL = "*"
"""The ``model_map`` key that maps every model name without an entry of its own (the single
``candidate.rewrite.model`` setting until issue 26)."""

COMPLETIONS_MAX_TOKENS = 16
"""``max_tokens`` of a candidate's /v1/completions request whose client left it out: vLLM's
default (the OpenAI API's), so the candidate generates what the incumbent did; TensorRT-LLM
would run to end-of-sequence (``candidate.rewrite.completions_max_tokens`` until issue 26:
another value only made the pair differ)."""

SECRET_FIELDS = CREDENTIAL_KEYS
"""Top-level body fields never stored (compared case-insensitively); deeper ones are removed
before a record leaves the mirror (:mod:`mirror.privacy`)."""


class CandidateRewrite(BaseModel):
    """How the candidate's request differs from the client's (``candidate.rewrite:`` in YAML)."""

    model_config = ConfigDict(extra="forbid")

    model_map: dict[str, str] = Field(
        default_factory=dict,
        description='client model name -> candidate model name; "*": every other model'
        ' (e.g. {"*": llama-trt} sends every request with that name)',
    )
    drop_fields: list[str] = Field(
        default_factory=list,
        description="top-level request fields removed before sending to the candidate",
    )
    chat_max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="max_tokens for chat requests with neither max_tokens nor"
        " max_completion_tokens; null: leave it out (both engines run to the context limit)",
    )


def with_stream_usage(body: dict[str, Any], *, hideable: bool = True) -> dict[str, Any] | None:
    """A copy of a streamed request with ``stream_options.include_usage`` set, or None when
    nothing changes (not streamed, already asked, or ``stream_options`` is not an object).

    ``hideable`` (the incumbent's request): only where the client's answer would otherwise
    differ by exactly what the mirror undoes (the usage event, the fingerprint it carries), so
    also None when ``stream_options`` has no ``include_usage`` key (vLLM's default for it was
    true in 0.11, is false in 0.32: either answer may be the one the client expects) or sets
    ``continuous_usage_stats`` (with ``include_usage``, vLLM puts usage on every event).
    """
    if body.get("stream") is not True:
        return None
    so = body.get("stream_options")
    if so is None:
        return {**body, "stream_options": {"include_usage": True}}
    if not isinstance(so, dict) or so.get("include_usage"):
        return None
    if hideable and ("include_usage" not in so or so.get("continuous_usage_stats")):
        return None
    return {**body, "stream_options": {**so, "include_usage": True}}


def candidate_request(
    body: dict[str, Any], *, chat: bool, rewrite: CandidateRewrite
) -> tuple[dict[str, Any], list[str]]:
    """The body to send to the candidate and the rewrites applied, in order. Credential-like
    fields (``api_key``, ``metadata.password``, ...: :data:`shadow_ab.privacy.CREDENTIAL_KEYS`)
    are removed at any depth first (``credential:<path>``): the candidate is often outside the
    incumbent's trust boundary and gets credentials of its own (``candidate.headers``)."""
    stripped, removed = strip_credentials(body)
    out = dict(stripped)
    done: list[str] = [f"{CREDENTIAL}:{path}" for path in removed]
    model = out.get("model")
    target = rewrite.model_map.get(model) if isinstance(model, str) else None
    if target is None:
        target = rewrite.model_map.get(ANY_MODEL)
    if target is not None and target != model:
        out["model"] = target
        done.append(MODEL)
    for name in rewrite.drop_fields:
        if name in out:
            del out[name]
            done.append(f"drop:{name}")
    if chat:
        if (
            rewrite.chat_max_tokens is not None
            and out.get("max_tokens") is None
            and out.get("max_completion_tokens") is None
        ):
            out["max_tokens"] = rewrite.chat_max_tokens
            done.append(MAX_TOKENS)
    elif "max_tokens" not in out:
        out["max_tokens"] = COMPLETIONS_MAX_TOKENS
        done.append(MAX_TOKENS)
    usage = with_stream_usage(out, hideable=False)  # the token count TPOT needs
    if usage is not None:
        out = usage
        done.append(INCLUDE_USAGE)
    return out, done


def with_top_logprobs(body: dict[str, Any], *, chat: bool, k: int) -> dict[str, Any] | None:
    """A copy of a request that asks for ``k`` top logprobs per token, or None when it already
    asks for alternatives. Chat: ``logprobs: true`` and ``top_logprobs`` (vLLM refuses
    ``top_logprobs`` without ``logprobs``); completions: ``logprobs: k`` (vLLM and TensorRT-LLM
    both take an integer there, at most 20 on vLLM by default)."""
    if chat:
        top = body.get("top_logprobs")
        if body.get("logprobs") is True and isinstance(top, int) and top > 0:
            return None
        return {**body, "logprobs": True, "top_logprobs": k}
    lp = body.get("logprobs")
    if isinstance(lp, int) and not isinstance(lp, bool) and lp > 0:
        return None
    return {**body, "logprobs": k}


def ask_top_logprobs(
    body: dict[str, Any], rewrites: list[str], *, chat: bool, k: int | None
) -> tuple[dict[str, Any], list[str]]:
    """``body`` with :func:`with_top_logprobs` applied (rewrite ``logprobs``) when ``k`` is
    set and the request did not ask for alternatives; else unchanged."""
    asked = with_top_logprobs(body, chat=chat, k=k) if k else None
    if asked is None:
        return body, rewrites
    return asked, [*rewrites, LOGPROBS]


def replay_request(
    body: dict[str, Any],
    rewrites: list[str],
    *,
    chat: bool,
    top_logprobs: int | None,
    delay_s: float,
    cache_salt: str | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """The replay's body (the incumbent's, with top logprobs and a ``cache_salt``, so it cannot
    reuse the original's prefix cache) and its rewrites, which also record how it was sent
    apart from the original (``replay_delay:<s>``, ``replay_pool:separate``: its own pool)."""
    out, done = ask_top_logprobs(body, rewrites, chat=chat, k=top_logprobs)
    if cache_salt is not None:
        out = {**out, "cache_salt": cache_salt}
        done = [*done, CACHE_SALT]
    return out, [*done, f"replay_delay:{delay_s:g}", "replay_pool:separate"]


def stored_request(body: dict[str, Any]) -> dict[str, Any]:
    """The request as kept in the store: without credential-like top-level fields."""
    if not any(k.lower() in SECRET_FIELDS for k in body):
        return body
    return {k: v for k, v in body.items() if k.lower() not in SECRET_FIELDS}
