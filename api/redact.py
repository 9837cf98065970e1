"""What a token without the ``content`` scope must not see: prompts and outputs.

Pure functions over plain values: :func:`split_request` separates a stored request body into
its prompt and its parameters; :func:`redact` nulls content fields anywhere in a JSON document
(a stored report's body), and token lists, and says whether it found text;
:func:`redact_parameters` and :func:`redact_error` clean a request's other fields (at any depth:
``metadata.api_key``, a ``user`` e-mail) and an exchange's ``error`` (engines echo the input
there) for a token without ``content``.
"""

from __future__ import annotations

from typing import Any

from shadow_ab.privacy import (
    error_summary,
    redact_strings,
    redact_text,
    redact_urls,
    strip_credentials,
)

PROMPT_KEYS = frozenset({"messages", "prompt", "input", "suffix"})
"""Request fields that carry what the user sent."""
CONTENT_KEYS = PROMPT_KEYS | frozenset(
    {
        "output_text",
        "output",
        "outputs",
        "incumbent_output",
        "candidate_output",
        "replay_output",
        "incumbent_text",
        "candidate_text",
        "replay_text",
        "logprobs",
        "top_logprobs",
        "completion",
        "content",
    }
)
"""Keys whose values are prompt or output text wherever they appear in a report body."""
TOKEN_KEYS = frozenset({"tokens", "divergent_tokens"})
"""Keys that hold output tokens when their value is a list of strings (the divergence
examples' tokens at the first divergence); a list of counts under the same key is kept."""


def _is_token_list(value: Any) -> bool:
    return isinstance(value, list) and any(isinstance(v, str) for v in value)


def split_request(request: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(the prompt or messages, the other fields) of a stored request body."""
    prompt = {k: v for k, v in request.items() if k in PROMPT_KEYS}
    params = {k: v for k, v in request.items() if k not in PROMPT_KEYS}
    if len(prompt) == 1:
        return next(iter(prompt.values())), params
    return (prompt or None), params


def redact(value: Any) -> tuple[Any, bool]:
    """``value`` with every :data:`CONTENT_KEYS` field and every token list set to None, and
    whether a :data:`CONTENT_KEYS` field held something (text a page would show; the report
    page does not render example tokens)."""
    if isinstance(value, dict):
        found = False
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key in CONTENT_KEYS:
                out[key] = None
                found = found or item not in (None, "", [], {})
            elif key in TOKEN_KEYS and _is_token_list(item):
                out[key] = None
            else:
                out[key], inner = redact(item)
                found = found or inner
        return out, found
    if isinstance(value, list):
        items = [redact(v) for v in value]
        return [v for v, _ in items], any(f for _, f in items)
    return value, False


def redact_parameters(params: dict[str, Any], *, content: bool) -> dict[str, Any]:
    """A request's fields other than the prompt as a token may see them: credential-like keys
    removed at any depth for every token; without ``content``, e-mail addresses, phone and card
    numbers, API keys and bearer tokens in every string replaced too
    (:func:`shadow_ab.privacy.redact_text`)."""
    out, _ = strip_credentials(params)
    return out if content else redact_strings(out, redact_text)


def redact_error(error: str | None, status: str, *, content: bool) -> str | None:
    """An exchange's ``error`` as a token may see it. Without ``content``, an engine's error
    body (status ``http_error``: engines echo the input in it) keeps only its type and code,
    and the mirror's own error texts pass the built-in redactor."""
    if not error:
        return error
    error = redact_urls(error)
    if content:
        return error
    if status == "http_error":
        return error_summary(error, "needs the content scope")
    return redact_text(error)
