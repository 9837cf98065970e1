"""Each flavor's wire format: request validation, response bodies, stream chunks, errors.

vLLM: what vLLM 0.32.0 answers, recorded from the real server in ``tests/fixtures/vllm-0.32.0/``
(``shadow-ab engine vllm record-fixtures``) and held by ``tests/simulator/test_sim_fixtures.py``
(same keys in the same order per chunk kind, same status, error shape and headers); the
details below were first checked against vLLM 0.11's sources (``entrypoints/openai/``
``protocol.py``, ``serving_chat.py``, ``serving_completion.py``, ``v1/engine/logprobs.py``)
and moved where 0.32 answers otherwise. TensorRT-LLM: what 1.2.0rc2's own ``OpenAIServer``
answered (``tests/fixtures/trtllm-1.2.0rc2/``, held by ``test_sim_trtllm_fixtures.py``).

=====================  ===========================================  ============================
                       vLLM                                         TensorRT-LLM
=====================  ===========================================  ============================
unknown fields         accepted (logged, ignored)                   400 (``extra="forbid"``)
completions max_tokens 16 by default                                none: up to end-of-sequence
wrong ``model``        404 ``NotFoundError``                        accepted
validation error body  ``{"error": {message, type, param, code}}``  ``{object, message, type,
                                                                    param, code}``, message the
                                                                    error list's ``str()``
first chat delta       ``{"role": "assistant", "content": ""}``     ``{"role": "assistant"}``,
                                                                    framed ``data: {..} \\n\\n``
stream chunks          ``logprobs``/``finish_reason``/``token_ids``  ``None`` fields left out
                       null keys, ``stop_reason``                   (chat), all kept (completion)
``include_usage``      false unless asked                           true, and continuous usage
=====================  ===========================================  ============================

Both: ``data: [DONE]`` last, usage chunk (empty ``choices``) with
``stream_options.include_usage``, ``continuous_usage_stats`` on every chunk, ``stream_options``
without ``stream`` is a 400.

vLLM details:

- chat chunks are dumped with ``exclude_unset=True`` (so ``stop_reason`` only on the last
  chunk of a choice; 0.32 adds ``token_ids: null`` to every choice and ``prompt_token_ids``/
  ``prompt_text: null`` to each choice's first chunk); completion chunks carry every choice
  field, ``null`` included, and (0.32) no ``usage`` key unless continuous usage; the final
  usage chunk of either leaves out nulls.
- ``continuous_usage_stats`` counts per choice (``previous_num_tokens[i]``) and, for a batch of
  completion prompts, that choice's prompt; the final usage chunk sums all choices.
- the engine's logprobs dict for a position holds the sampled token first, then the top-N; chat
  ``top_logprobs`` takes the first ``top_logprobs`` entries of it, completions take up to N+1
  (so ``logprobs: 0`` still gives ``{sampled: lp}``).
- errors: FastAPI's validation errors are ``type: "Bad Request"`` with ``param`` their
  location; vLLM's own (``VLLMValidationError``: ``stream_options`` without ``stream``,
  ``top_logprobs`` without ``logprobs``, more than ``max_logprobs`` (20), ``max_tokens`` or a
  prompt above ``max_model_len``) are ``BadRequestError`` with ``param`` and the message
  ending ``(parameter=..., value=...)``.

``system_fingerprint`` is placed as real vLLM 0.32.0 places it (seen on the server that
``shadow-ab engine vllm serve`` runs, ``--fingerprint-mode full``): ``vllm-<version>-<hash8>``
in whole answers; in streams on each choice's finish chunk (as its last member) when no usage
chunk follows, and on the usage chunk (after ``usage``) otherwise, never on both. The mirror
hides that usage chunk from clients that did not ask for it and must put the fingerprint back
(``mirror/sse.py``, ``UsageHider``).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from typing import Annotated, Any, ClassVar, Literal

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from simulator.generate import TOP_K_MAX, Completion, Token
from simulator.vocab import VOCAB_SIZE

Flavor = Literal["vllm", "trtllm"]

_WORD_RE = re.compile(r"\w+|[^\w\s]")


def count_tokens(text: str) -> int:
    """A tokenizer stand-in: words and punctuation marks (same on both flavors)."""
    return len(_WORD_RE.findall(text))


class WireError(Exception):
    """A request the engine refuses, with the HTTP status and body it answers."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(str(body))
        self.status = status
        self.body = body


def error_body(
    flavor: Flavor, status: int, message: str, err_type: str, param: str | None = None
) -> dict[str, Any]:
    if flavor == "vllm":
        return {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return {"object": "error", "message": message, "type": err_type, "param": param, "code": status}


# -- requests --------------------------------------------------------------------------


class StreamOptions(BaseModel):
    """TensorRT-LLM's: with ``include_usage``, usage on every chunk unless
    ``continuous_usage_stats`` is false."""

    model_config = ConfigDict(extra="forbid")
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = True


class VllmStreamOptions(BaseModel):
    """vLLM 0.32's: ``include_usage`` defaults to false (0.11: true), unknown keys allowed."""

    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    n: Annotated[int, Field(ge=1, le=128)] = 1
    best_of: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: Annotated[float, Field(ge=0.0)] | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = 0.0
    presence_penalty: float | None = 0.0
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    echo: bool | None = False
    use_beam_search: bool = False
    length_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(ge=0)] = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    add_special_tokens: bool = True
    response_format: dict[str, Any] | None = None
    priority: float | None = None

    _STREAM_OPTIONS_REFUSAL: ClassVar[str] = (
        "Stream options can only be defined when `stream=True`."
    )

    @model_validator(mode="before")
    @classmethod
    def _stream_options_need_stream(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("stream_options") and not data.get("stream"):
            cls._refuse(cls._STREAM_OPTIONS_REFUSAL, "stream_options")
        return data

    @classmethod
    def _refuse(cls, message: str, parameter: str, value: Any = None) -> None:
        """A model validator's refusal: a pydantic error here, :class:`VllmValidationError`
        on vLLM (which pydantic lets through, so vLLM answers ``BadRequestError``)."""
        raise ValueError(message)

    @property
    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class _Chat(_Sampling):
    messages: Annotated[list[dict[str, Any]], Field(min_length=1)]
    logprobs: bool | None = False
    top_logprobs: Annotated[int, Field(ge=0, le=TOP_K_MAX)] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, Any]] | None = None
    reasoning_effort: str | None = None

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> _Chat:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("when using `top_logprobs`, `logprobs` must be set to true.")
        return self

    @property
    def output_budget(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class _Completion(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: Annotated[int, Field(ge=0, le=TOP_K_MAX)] | None = None
    max_tokens: Annotated[int, Field(ge=0)] | None = 16
    suffix: str | None = None

    @property
    def output_budget(self) -> int | None:
        return self.max_tokens


class VllmValidationError(Exception):
    """vLLM's ``VLLMValidationError``: not a ValueError, so a model validator raising it is
    not turned into a pydantic validation error; vLLM answers it 400 ``BadRequestError`` with
    ``param`` and the message ending ``(parameter=..., value=...)``."""

    def __init__(self, message: str, *, parameter: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.value = value

    def __str__(self) -> str:
        extras = [f"{k}={v}" for k, v in (("parameter", self.parameter), ("value", self.value))
                  if v is not None]  # fmt: skip
        base = super().__str__()
        return f"{base} ({', '.join(extras)})" if extras else base


class _VllmRefusals:
    @classmethod
    def _refuse(cls, message: str, parameter: str, value: Any = None) -> None:
        raise VllmValidationError(message, parameter=parameter, value=value)


class VllmChatRequest(_VllmRefusals, _Chat):
    model_config = ConfigDict(extra="allow", title="ChatCompletionRequest")
    stream_options: VllmStreamOptions | None = None  # type: ignore[assignment]
    # vLLM's default is 0; the bound is the engine's max_logprobs (checked in parse_request)
    top_logprobs: int | None = 0

    @model_validator(mode="before")
    @classmethod
    def _vllm_logprobs(cls, data: Any) -> Any:
        """protocol.py ``check_logprobs`` (a before validator, so it runs first)."""
        if isinstance(data, dict):
            top = data.get("top_logprobs")
            if top is not None and not isinstance(top, int | float):
                cls._refuse("`top_logprobs` must be an integer.", "top_logprobs", top)
            if isinstance(top, int | float) and top < 0 and top != -1:
                cls._refuse("`top_logprobs` must be a positive value or -1.", "top_logprobs", top)
            if isinstance(top, int | float) and (top == -1 or top > 0) and not data.get("logprobs"):
                cls._refuse(
                    "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs"
                )
        return data

    @property
    def logprobs_asked(self) -> int | None:
        # serving_chat.py: logprobs only `if request.logprobs and request.top_logprobs is not None`
        return self.top_logprobs if self.logprobs and self.top_logprobs is not None else None


class VllmCompletionRequest(_VllmRefusals, _Completion):
    model_config = ConfigDict(extra="allow", title="CompletionRequest")
    stream_options: VllmStreamOptions | None = None  # type: ignore[assignment]
    logprobs: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _vllm_logprobs(cls, data: Any) -> Any:
        if isinstance(data, dict):
            lp = data.get("logprobs")
            if isinstance(lp, int) and lp < 0 and lp != -1:
                cls._refuse("`logprobs` must be a positive value or -1.", "logprobs", lp)
        return data

    @property
    def logprobs_asked(self) -> int | None:
        return self.logprobs


VLLM_VALIDATION_TYPE = "Bad Request"
"""vLLM's error ``type`` for a request that fails validation (``HTTPStatus.BAD_REQUEST.phrase``)."""

VLLM_MAX_LOGPROBS = 20
"""vLLM's default ``--max-logprobs``."""


class TrtChatRequest(_Chat):
    model_config = ConfigDict(extra="forbid", title="ChatCompletionRequest")
    _STREAM_OPTIONS_REFUSAL = "stream_options can only be set if stream is true"

    @model_validator(mode="before")
    @classmethod
    def _trt_top_needs_logprobs(cls, data: Any) -> Any:
        """``check_logprobs``: any ``top_logprobs`` (0 too) needs ``logprobs``."""
        asked = isinstance(data, dict) and data.get("top_logprobs") is not None
        if asked and not data.get("logprobs"):
            raise ValueError("logprobs must be true when using top_logprobs")
        return data

    model: str  # required on TensorRT-LLM
    cache_salt: str | None = None
    disaggregated_params: dict[str, Any] | None = None
    conversation_params: dict[str, Any] | None = None
    lora_request: dict[str, Any] | None = None


class TrtCompletionRequest(_Completion):
    model_config = ConfigDict(extra="forbid", title="CompletionRequest")
    model: str  # required on TensorRT-LLM
    max_tokens: Annotated[int, Field(ge=0)] | None = None
    disaggregated_params: dict[str, Any] | None = None
    conversation_params: dict[str, Any] | None = None
    lora_request: dict[str, Any] | None = None
    detokenize: bool = True
    prompt_ignore_length: int | None = 0

    _STREAM_OPTIONS_REFUSAL = "Stream options can only be defined when stream is true."

    @model_validator(mode="before")
    @classmethod
    def _no_logprobs(cls, data: Any, info: ValidationInfo) -> Any:
        """``check_logprobs``: TensorRT-LLM's completions have no logprobs (any truthy value);
        a scenario can let them through (``Scenario.trtllm_completion_logprobs``)."""
        lenient = bool((info.context or {}).get("completion_logprobs"))
        if isinstance(data, dict) and data.get("logprobs") and not lenient:
            raise ValueError("logprobs is not supported")
        return data

    @model_validator(mode="before")
    @classmethod
    def _no_suffix(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("suffix"):
            raise ValueError("suffix is not supported")
        return data


_MODELS: dict[tuple[str, str], type[_Chat] | type[_Completion]] = {
    ("vllm", "chat"): VllmChatRequest,
    ("vllm", "completions"): VllmCompletionRequest,
    ("trtllm", "chat"): TrtChatRequest,
    ("trtllm", "completions"): TrtCompletionRequest,
}


def parse_request(
    flavor: Flavor,
    endpoint: str,
    raw: bytes,
    served_model: str,
    *,
    completion_logprobs: bool = False,
) -> _Chat | _Completion:
    """Validate one request body the way the flavor does; raise :class:`WireError` if refused.

    vLLM 0.32 answers what FastAPI refuses (a body that is not JSON, a field of the wrong type
    or out of bounds) from ``validation_exception_handler``: 400 ``type: "Bad Request"``, the
    message ``"N validation error(s):\n  {...}"`` built from ``exc.errors()`` and ``param`` the
    first error's location (``body.37``, ``body.n``). What its model validators and the serving
    layer refuse (``stream_options`` without ``stream``, ``top_logprobs`` without
    ``logprobs``, more than ``max_logprobs``, the context length) is a ``VLLMValidationError``:
    400 ``BadRequestError`` with ``param`` and the message ending ``(parameter=..., value=...)``.
    """
    vllm = flavor == "vllm"
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if vllm:
            raise _vllm_invalid_json(raw) from exc
        raise _trt_validation_error([_json_invalid(raw)]) from exc
    if not isinstance(data, dict):
        error = {"type": "model_attributes_type", "loc": ("body",),
                 "msg": "Input should be a valid dictionary or object to extract fields from",
                 "input": data}  # fmt: skip
        raise _vllm_validation_error([error]) if vllm else _trt_validation_error([error])
    model_cls = _MODELS[(flavor, endpoint)]
    try:
        req = model_cls.model_validate(data, context={"completion_logprobs": completion_logprobs})
    except VllmValidationError as exc:
        raise WireError(
            400, error_body(flavor, 400, str(exc), "BadRequestError", exc.parameter)
        ) from exc
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        if vllm:
            raise _vllm_validation_error(errors) from exc
        raise _trt_validation_error(errors) from exc
    if vllm and req.model is not None and req.model != served_model:
        msg = f"The model `{req.model}` does not exist. Valid aliases: {served_model}."
        raise WireError(404, error_body(flavor, 404, msg, "NotFoundError", "model"))
    return req


def vllm_logprobs_error(req: _Chat | _Completion) -> WireError | None:
    """sampling_params.py ``_validate_logprobs``: more than ``max_logprobs`` (20) alternatives
    (``-1``: the whole vocabulary) is refused, after the request is rendered."""
    if not isinstance(req, VllmChatRequest | VllmCompletionRequest):
        return None
    asked = req.logprobs_asked
    if asked is None or not (asked == -1 or asked > VLLM_MAX_LOGPROBS):
        return None
    n = VOCAB_SIZE if asked == -1 else asked
    exc = VllmValidationError(
        f"Requested sample logprobs of {n}, which is greater than max allowed: {VLLM_MAX_LOGPROBS}",
        parameter="logprobs",
        value=n,
    )
    return WireError(400, error_body("vllm", 400, str(exc), "BadRequestError", exc.parameter))


def vllm_length_error(
    req: _Chat | _Completion, prompt_tokens: list[int], max_model_len: int
) -> WireError | None:
    """vLLM 0.32's context checks (``renderers/params.py``): ``max_tokens`` above
    ``max_model_len``, then a prompt longer than ``max_model_len`` (the tokenizer stops one
    token past it, hence "at least"). A prompt that fits with a budget that does not is not
    refused: the budget is cut to what is left (``get_max_tokens``)."""
    budget = req.output_budget
    if budget is not None and budget > max_model_len:
        name = (
            "max_completion_tokens"
            if isinstance(req, _Chat) and req.max_completion_tokens is not None
            else "max_tokens"
        )
        exc = VllmValidationError(
            f"{name}={budget} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            parameter=name,
            value=budget,
        )
        return WireError(400, error_body("vllm", 400, str(exc), "BadRequestError", name))
    for n in prompt_tokens:
        if n > max_model_len:
            count = min(n, max_model_len + 1)
            qualifier = "at least " if count == max_model_len + 1 else ""
            exc = VllmValidationError(
                f"This model's maximum context length is {max_model_len} tokens. However, your "
                f"prompt contains {qualifier}{count} input tokens, which exceeds this limit even "
                "without any output tokens. Please reduce the length of the input prompt.",
                parameter="input_tokens",
                value=count,
            )
            return WireError(
                400, error_body("vllm", 400, str(exc), "BadRequestError", exc.parameter)
            )
    return None


def _vllm_invalid_json(raw: bytes) -> WireError:
    """FastAPI's ``json_invalid`` error, as vLLM's validation handler words it."""
    return _vllm_validation_error([_json_invalid(raw)])


def _trt_validation_error(errors: list[dict[str, Any]]) -> WireError:
    """TensorRT-LLM's ``validation_exception_handler``: ``str(exc)`` of FastAPI's
    ``RequestValidationError`` (the error list's repr) in its error envelope, param null."""
    return WireError(400, error_body("trtllm", 400, str(errors), "BadRequestError"))


MULTIPLE_RESPONSES = "Multiple response is not supported in PyTorch workflow"
"""``chat_utils.check_multiple_response``: ``n > 1`` on the PyTorch backend."""


def _json_invalid(raw: bytes) -> dict[str, Any]:
    """FastAPI's ``json_invalid`` error (from the standard library's decoder, as FastAPI
    uses it: its position and reason)."""
    try:
        json.loads(raw)
    except json.JSONDecodeError as exc:
        pos, reason = exc.pos, exc.msg
    except ValueError as exc:  # not UTF-8
        pos, reason = 0, str(exc)
    else:  # orjson is stricter (e.g. NaN): say so the way FastAPI would not need to
        pos, reason = 0, "Invalid JSON"
    return {"type": "json_invalid", "loc": ("body", pos), "msg": "JSON decode error",
            "input": {}, "ctx": {"error": reason}}  # fmt: skip


def _vllm_validation_error(errors: list[dict[str, Any]]) -> WireError:
    """vLLM's ``validation_exception_handler``: at most 10 errors, each with its ``input``
    summarised and its ``loc`` joined with dots; ``param`` the first one's location."""
    shown = []
    for e in errors[:10]:
        e = dict(e)
        e["loc"] = ".".join(str(p) for p in e["loc"])
        if "input" in e:
            e["input"] = _summarise_input(e["input"])
        shown.append(f"  {e}\n")
    label = "error" if len(errors) == 1 else "errors"
    message = f"{len(errors)} validation {label}:\n" + "".join(shown)
    if len(errors) > 10:
        message += f"  ...and {len(errors) - 10} more {label}\n"
    param = ".".join(str(p) for p in errors[0]["loc"]) if errors else None
    body = error_body("vllm", 400, message.rstrip(), VLLM_VALIDATION_TYPE, param)
    return WireError(400, body)


def _summarise_input(value: Any) -> Any:
    if isinstance(value, str):
        return value if len(value) <= 200 else value[:200] + "...[truncated]"
    if isinstance(value, list | tuple | dict | set):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = str(value)
    return text if len(text) <= 200 else text[:200] + "...[truncated]"


def logprobs_asked(req: _Chat | _Completion) -> int | None:
    """How many alternatives per token the request asked for (None: no logprobs at all)."""
    if isinstance(req, VllmChatRequest | VllmCompletionRequest):
        return req.logprobs_asked
    if isinstance(req, _Chat):
        return (req.top_logprobs or 0) if req.logprobs else None
    return req.logprobs


def chat_prompt(messages: list[dict[str, Any]]) -> tuple[str, int]:
    """The rendered prompt (a simple chat template) and its token count."""
    parts = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"<|{m.get('role', 'user')}|>\n{content or ''}\n")
    text = "".join(parts) + "<|assistant|>\n"
    return text, count_tokens(text) + 3 * len(messages) + 1


def completion_prompts(
    prompt: str | list[str] | list[int] | list[list[int]],
) -> list[tuple[str, int]]:
    """Each prompt of a (possibly batched) completion request, with its token count."""
    if isinstance(prompt, str):
        return [(prompt, count_tokens(prompt) + 1)]
    if not prompt:
        return [("", 1)]
    if all(isinstance(p, str) for p in prompt):
        return [(str(p), count_tokens(str(p)) + 1) for p in prompt]
    if all(isinstance(p, int) for p in prompt):
        return [(" ".join(map(str, prompt)), len(prompt))]
    return [(" ".join(map(str, p)), len(p)) for p in prompt if isinstance(p, list)]


# -- responses -------------------------------------------------------------------------


def vllm_fingerprint(version: str, model: str) -> str:
    """A vLLM-style ``system_fingerprint``: ``vllm-<version>-<hash8>`` (vLLM hashes its whole
    config; here the model name stands for it)."""
    return f"vllm-{version}-{hashlib.sha256(model.encode()).hexdigest()[:8]}"


class Framer:
    """Builds one response's bodies and SSE events for one flavor and endpoint.

    ``fingerprint``: the ``system_fingerprint`` the vLLM flavor stamps (None: none)."""

    def __init__(
        self,
        flavor: Flavor,
        endpoint: str,
        model: str,
        *,
        stream: bool,
        seq_no: int,
        fingerprint: str | None = None,
    ) -> None:
        self.flavor = flavor
        self.fingerprint = fingerprint if flavor == "vllm" else None
        self.endpoint = endpoint
        self.model = model
        self.created = int(time.time())
        chat = endpoint == "chat"
        prefix = "chatcmpl" if chat else "cmpl"
        if flavor == "trtllm" and stream:  # numbered, so a stream's bytes are reproducible
            self.id = f"{prefix}-{seq_no}"
        else:
            self.id = f"{prefix}-{uuid.uuid4().hex}"
        self._events = 0
        obj = (
            ("chat.completion.chunk" if stream else "chat.completion")
            if chat
            else "text_completion"
        )
        self.base = {"id": self.id, "object": obj, "created": self.created, "model": model}

    # logprobs ------------------------------------------------------------------------

    def _alternatives(self, t: Token, top: int, *, completions: bool) -> list[tuple[str, float]]:
        """The alternatives one token's logprobs list. vLLM's engine dict holds the sampled
        token first, then the top-N (``v1/engine/logprobs.py``); chat takes its first ``top``
        entries, completions all of them (``num_output_top_logprobs >= i``: up to N+1)."""
        if self.flavor != "vllm":
            return list(t.top[:top])
        ordered = {t.text: t.logprob}
        for s, lp in t.top[:top]:
            ordered.setdefault(s, lp)
        items = list(ordered.items())
        return items if completions else (items[:top] if top else [])

    def chat_logprobs(self, tokens: list[Token], top: int) -> dict[str, Any]:
        """TensorRT-LLM (``create_logprobs``): ``top_logprobs`` null unless asked (> 0)."""
        content = []
        for t in tokens:
            alternatives: list[dict[str, Any]] | None = [
                {"token": s, "logprob": lp, "bytes": list(s.encode())}
                for s, lp in self._alternatives(t, top, completions=False)
            ]
            if self.flavor == "trtllm" and not top:
                alternatives = None
            content.append(
                {
                    "token": t.text,
                    "logprob": t.logprob,
                    "bytes": list(t.text.encode()),
                    "top_logprobs": alternatives,
                }
            )
        return {"content": content}

    def completion_logprobs(self, tokens: list[Token], top: int, offset: int) -> dict[str, Any]:
        offsets: list[int] = []
        lps: list[float] = []
        texts: list[str] = []
        tops: list[dict[str, float] | None] = []
        pos = offset
        vllm = self.flavor == "vllm"
        for t in tokens:
            offsets.append(pos)
            pos += len(t.text)
            lps.append(t.logprob)
            texts.append(t.text)
            if vllm:
                tops.append(dict(self._alternatives(t, top, completions=True)))
            else:
                tops.append({s: lp for s, lp in t.top[:top]} if top else None)
        return {
            "text_offset": offsets,
            "token_logprobs": lps,
            "tokens": texts,
            "top_logprobs": tops,
        }

    # SSE -----------------------------------------------------------------------------

    def event(self, obj: dict[str, Any], *, trailing_space: bool = False) -> bytes:
        """One SSE event. TensorRT-LLM builds each chunk as a new pydantic object, whose ``id``
        is a fresh ``random_uuid()``: the first chunk carries :attr:`id` (what the ledger
        names), the k-th after it ``<id>-<k>`` (its own, and the same bytes on a replay)."""
        if self.flavor == "trtllm" and self._events and "id" in obj:
            prefix = str(obj["id"]).split("-", 1)[0]
            obj = {**obj, "id": f"{prefix}-{self.id.split('-', 1)[1]}-{self._events}"}
        self._events += 1
        return b"data: " + orjson.dumps(obj) + (b" \n\n" if trailing_space else b"\n\n")

    DONE = b"data: [DONE]\n\n"

    def role_chunk(self, index: int, usage: dict[str, Any] | None) -> bytes:
        """The first chat event of one choice (before any token)."""
        if self.flavor == "vllm":
            choice: dict[str, Any] = {
                "index": index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            chunk = {**self.base, "choices": [choice]}
            if usage is not None:
                chunk["usage"] = usage
            chunk["prompt_token_ids"] = None  # 0.32: the first chunk of each choice
            chunk["prompt_text"] = None
            return self.event(chunk)
        chunk = {**self.base, "choices": [{"index": index, "delta": {"role": "assistant"}}]}
        if usage is not None:
            chunk["usage"] = usage
        return self.event(chunk, trailing_space=True)

    def token_chunk(
        self,
        index: int,
        tokens: list[Token],
        *,
        finish_reason: str | None,
        stop_reason: str | None,
        logprobs: int | None,
        text_offset: int,
        usage: dict[str, Any] | None,
        usage_follows: bool = False,
    ) -> bytes:
        """One choice's chunk; ``usage_follows``: a usage chunk ends the stream (vLLM then
        stamps the fingerprint there instead of on the finish chunk)."""
        text = "".join(t.text for t in tokens)
        vllm = self.flavor == "vllm"
        if self.endpoint == "chat":
            choice: dict[str, Any] = {
                "index": index,
                "delta": {"content": text} if vllm else {"content": text, "reasoning_content": ""},
            }
            lp = self.chat_logprobs(tokens, logprobs or 0) if logprobs is not None else None
            if vllm:
                choice["logprobs"] = lp
                choice["finish_reason"] = finish_reason
                if finish_reason is not None:
                    choice["stop_reason"] = stop_reason
                choice["token_ids"] = None
            else:
                if lp is not None:
                    choice["logprobs"] = lp
                if finish_reason is not None:
                    choice["finish_reason"] = finish_reason
                if stop_reason is not None:
                    choice["stop_reason"] = stop_reason
        else:
            lp = (
                self.completion_logprobs(tokens, logprobs or 0, text_offset)
                if logprobs is not None
                else None
            )
            if vllm:  # CompletionResponseStreamChoice, dumped with exclude_unset=False
                choice = {"index": index, "text": text, "logprobs": lp,
                          "finish_reason": finish_reason, "stop_reason": stop_reason,
                          "prompt_token_ids": None, "token_ids": None}  # fmt: skip
            else:
                choice = {"index": index, "text": text, "token_ids": None, "logprobs": lp,
                          "finish_reason": finish_reason, "stop_reason": stop_reason,
                          "avg_decoded_tokens_per_iter": None}  # fmt: skip
        chunk: dict[str, Any] = {**self.base, "choices": [choice]}
        if usage is not None:
            chunk["usage"] = usage
        elif self.endpoint == "completions" and not vllm:  # vLLM 0.11 had usage: null too
            chunk["usage"] = None
        if finish_reason is not None and self.fingerprint is not None and not usage_follows:
            chunk["system_fingerprint"] = self.fingerprint
        return self.event(chunk)

    def usage_chunk(self, usage: dict[str, Any]) -> bytes:
        """The final usage chunk (TensorRT-LLM: a ``ChatCompletionStreamResponse`` on both
        endpoints, so completions' says ``chatcmpl-`` and ``chat.completion.chunk``)."""
        chunk: dict[str, Any] = {**self.base, "choices": [], "usage": usage}
        if self.flavor == "trtllm":
            chunk["id"] = "chatcmpl-" + self.id.split("-", 1)[1]  # event() numbers it
            chunk["object"] = "chat.completion.chunk"
        if self.flavor == "vllm":  # dumped with exclude_none=True
            chunk["usage"] = {k: v for k, v in usage.items() if v is not None}
            if self.fingerprint is not None:
                chunk["system_fingerprint"] = self.fingerprint
        return self.event(chunk)

    def usage(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        u: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        }
        if self.flavor == "trtllm":
            u["prompt_tokens_details"] = {"cached_tokens": 0}
        else:
            u["prompt_tokens_details"] = None
            u["completion_tokens_details"] = None
        return u

    def stream_usage(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        """A ``continuous_usage_stats`` usage object inside a stream chunk (vLLM 0.32: chat's
        has ``completion_tokens_details: null``, completions' neither details key)."""
        u = self.usage(prompt_tokens, completion_tokens)
        if self.flavor == "vllm":
            del u["prompt_tokens_details"]
            if self.endpoint != "chat":
                del u["completion_tokens_details"]
        return u

    # whole responses -----------------------------------------------------------------

    def response(
        self,
        completions: list[Completion],
        prompt_tokens: int,
        *,
        logprobs: int | None,
        echo_prefix: list[str] | None = None,
    ) -> dict[str, Any]:
        if self.flavor == "vllm":
            return self._vllm_response(completions, prompt_tokens, logprobs, echo_prefix)
        choices = []
        for i, c in enumerate(completions):
            # ChatCompletionResponseChoice / CompletionResponseChoice, every field dumped
            if self.endpoint == "chat":
                message: dict[str, Any] = {"role": "assistant", "content": c.text,
                                           "reasoning_content": "", "reasoning": None,
                                           "tool_calls": []}  # fmt: skip
                lp = self.chat_logprobs(c.tokens, logprobs or 0) if logprobs is not None else None
                choice: dict[str, Any] = {"index": i, "message": message, "logprobs": lp,
                                          "finish_reason": c.finish_reason,
                                          "stop_reason": c.stop_reason,
                                          "mm_embedding_handle": None}  # fmt: skip
            else:
                prefix = echo_prefix[i] if echo_prefix else ""
                lp = (
                    self.completion_logprobs(c.tokens, logprobs or 0, len(prefix))
                    if logprobs is not None
                    else None
                )
                choice = {"index": i, "text": prefix + c.text, "token_ids": None, "logprobs": lp,
                          "context_logits": None, "finish_reason": c.finish_reason,
                          "stop_reason": c.stop_reason}  # fmt: skip
            choice.update(disaggregated_params=None, avg_decoded_tokens_per_iter=None)
            choices.append(choice)
        body: dict[str, Any] = {**self.base, "choices": choices}
        body["usage"] = self.usage(prompt_tokens, sum(len(c.tokens) for c in completions))
        body["prompt_token_ids"] = None
        return body

    def _vllm_response(
        self,
        completions: list[Completion],
        prompt_tokens: int,
        logprobs: int | None,
        echo_prefix: list[str] | None,
    ) -> dict[str, Any]:
        """vLLM 0.32's ChatCompletionResponse / CompletionResponse, every field dumped (nulls
        included), in its order."""
        chat = self.endpoint == "chat"
        choices = []
        for i, c in enumerate(completions):
            if chat:
                message = {"role": "assistant", "content": c.text, "refusal": None,
                           "annotations": None, "audio": None, "function_call": None,
                           "reasoning": None}  # fmt: skip
                lp = self.chat_logprobs(c.tokens, logprobs or 0) if logprobs is not None else None
                choice: dict[str, Any] = {"index": i, "message": message, "logprobs": lp}
            else:
                prefix = echo_prefix[i] if echo_prefix else ""
                lp = (
                    self.completion_logprobs(c.tokens, logprobs or 0, len(prefix))
                    if logprobs is not None
                    else None
                )
                choice = {"index": i, "text": prefix + c.text, "logprobs": lp}
            choice.update(finish_reason=c.finish_reason, stop_reason=c.stop_reason, token_ids=None)
            if not chat:
                choice.update(prompt_logprobs=None, prompt_token_ids=None)
            choice["routed_experts"] = None
            choices.append(choice)
        body: dict[str, Any] = {
            **self.base,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": self.fingerprint,
            "usage": self.usage(prompt_tokens, sum(len(c.tokens) for c in completions)),
        }
        if chat:
            body.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
        body.update(kv_transfer_params=None, ec_transfer_params=None, metrics=None)
        return body


def models_body(flavor: Flavor, model: str, max_model_len: int, created: int) -> dict[str, Any]:
    card: dict[str, Any] = {"id": model, "object": "model", "created": created}
    if flavor == "vllm":  # root: real vLLM gives the model's path; the permission's id is
        # random per answer there, stable per process here (so two reads are the same bytes)
        card.update(owned_by="vllm", root=model, parent=None, max_model_len=max_model_len)
        card["permission"] = [
            {"id": f"modelperm-{hashlib.md5(f'{model}:{created}'.encode()).hexdigest()}",
             "object": "model_permission",
             "created": created, "allow_create_engine": False, "allow_sampling": True,
             "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
             "allow_fine_tuning": False, "organization": "*", "group": None,
             "is_blocking": False}
        ]  # fmt: skip
    else:
        card["owned_by"] = "tensorrt_llm"
    return {"object": "list", "data": [card]}
