# mypy: ignore-errors
# ruff: noqa
"""Install stub modules so that the real tensorrt_llm/serve/*.py files import
without torch, CUDA, tensorrt or the C++ bindings.  Only module *names* that
openai_server.py / openai_protocol.py / postprocess_handlers.py / chat_utils.py
import are provided.  The real files are read from the TensorRT-LLM source tree (or
unpacked wheel) named by $TRTLLM_SOURCE: $TRTLLM_SOURCE/tensorrt_llm/serve/... ."""

import os
import sys
import tempfile
import types
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, List, NamedTuple, Optional, TypeAlias

import transformers  # noqa: F401  (import before the fake torch is installed)
from pydantic import BaseModel, ConfigDict

SRC = os.path.join(os.environ["TRTLLM_SOURCE"], "tensorrt_llm")
SRC = os.path.normpath(SRC)


def _mod(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def _pkg(name, path=None, **attrs):
    m = _mod(name, **attrs)
    m.__path__ = [path] if path else []
    return m


# ---- third-party heavy deps -------------------------------------------------
class _Tensor(list):
    def tolist(self):
        return list(self)


_mod("torch", Tensor=_Tensor, float32="float32", zeros=lambda n, dtype=None: _Tensor([0.0] * n))


class _Format(BaseModel):
    model_config = ConfigDict(extra="allow")


_xg = _mod("xgrammar")
_xg.structural_tag = _mod("xgrammar.structural_tag", Format=_Format)

# ---- tensorrt_llm package skeleton (real __init__ bypassed) -----------------
_pkg("tensorrt_llm", SRC)
_pkg("tensorrt_llm.serve", os.path.join(SRC, "serve"))
_pkg("tensorrt_llm.metrics", os.path.join(SRC, "metrics"))


class _Logger:
    def __getattr__(self, name):
        import logging

        return getattr(logging.getLogger("tensorrt_llm"), name)


_mod("tensorrt_llm.logger", logger=_Logger())


def nvtx_range_debug(*a, **k):

    class _R:
        def __call__(self, f):
            return f

        def __enter__(self):
            return self

        def __exit__(self, *e):
            return False

    return _R()


_prom_dir = None


def set_prometheus_multiproc_dir():
    global _prom_dir
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        _prom_dir = tempfile.TemporaryDirectory(dir=os.environ["PROMETHEUS_MULTIPROC_DIR"])
    else:
        _prom_dir = tempfile.TemporaryDirectory()
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = _prom_dir.name


_mod(
    "tensorrt_llm._utils",
    nvtx_range_debug=nvtx_range_debug,
    nvtx_mark=lambda *a, **k: None,
    set_prometheus_multiproc_dir=set_prometheus_multiproc_dir,
)
_pkg("tensorrt_llm._torch")
_mod("tensorrt_llm._torch.model_config", _CONFIG_REGISTRY={})


# ---- executor ---------------------------------------------------------------
class CppExecutorError(RuntimeError):
    pass


@dataclass(kw_only=True)
class PostprocArgs:
    first_iteration: bool = True
    num_prompt_tokens: Optional[int] = None
    tokenizer: Any = None


@dataclass(kw_only=True)
class PostprocParams:
    post_processor: Callable = None
    postproc_args: PostprocArgs = None


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: Optional[int] = None


TokenLogprobs: TypeAlias = list[dict[int, Logprob]]


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""


class GenerationResultBase:
    pass


class DetokenizedGenerationResultBase(GenerationResultBase):
    pass


class GenerationResult(DetokenizedGenerationResultBase):
    pass


_pkg(
    "tensorrt_llm.executor",
    CppExecutorError=CppExecutorError,
    GenerationResultBase=GenerationResultBase,
    DetokenizedGenerationResultBase=DetokenizedGenerationResultBase,
    GenerationResult=GenerationResult,
)
_mod(
    "tensorrt_llm.executor.postproc_worker",
    PostprocArgs=PostprocArgs,
    PostprocParams=PostprocParams,
)
_mod("tensorrt_llm.executor.result", Logprob=Logprob, TokenLogprobs=TokenLogprobs)
_mod("tensorrt_llm.executor.request", LoRARequest=LoRARequest)


# ---- llmapi -----------------------------------------------------------------
class SamplingParams:
    """Attribute bag standing in for tensorrt_llm.SamplingParams."""

    def __init__(self, **kw):
        self.n = 1
        self.best_of = None
        self.logprobs = None
        self._return_log_probs = False
        self.max_tokens = None
        self.detokenize = True
        self.return_perf_metrics = False
        self.__dict__.update(kw)
        if self.best_of is None:
            self.best_of = self.n


@dataclass
class LlmDisaggregatedParams:
    request_type: Optional[str] = None
    first_gen_tokens: Optional[List[int]] = None
    ctx_request_id: Optional[int] = None
    opaque_state: Optional[bytes] = None
    draft_tokens: Optional[List[int]] = None


class GuidedDecodingParams:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class MultimodalEncoder:
    pass


class ServerRole(Enum):
    CONTEXT = 0
    GENERATION = 1
    MM_ENCODER = 2


class _ReasoningResult(NamedTuple):
    content: str
    reasoning_content: str


class ReasoningParserFactory:
    @staticmethod
    def create_reasoning_parser(name):
        raise ValueError(f"stub: reasoning parser {name!r} not available")


_pkg(
    "tensorrt_llm.llmapi",
    DisaggregatedParams=LlmDisaggregatedParams,
    MultimodalEncoder=MultimodalEncoder,
    GuidedDecodingParams=GuidedDecodingParams,
    SamplingParams=SamplingParams,
)
_mod(
    "tensorrt_llm.llmapi.disagg_utils",
    DisaggClusterConfig=object,
    MetadataServerConfig=object,
    ServerRole=ServerRole,
)
_mod("tensorrt_llm.llmapi.llm", RequestOutput=GenerationResult)
_mod(
    "tensorrt_llm.llmapi.reasoning_parser",
    BaseReasoningParser=object,
    ReasoningParserFactory=ReasoningParserFactory,
)
_mod("tensorrt_llm.llmapi.tokenizer", TransformersTokenizer=object)


class LLM:  # tensorrt_llm._tensorrt_engine.LLM
    pass


_mod("tensorrt_llm._tensorrt_engine", LLM=LLM)


# ---- inputs -----------------------------------------------------------------
def prompt_inputs(inputs):
    if isinstance(inputs, str):
        return {"prompt": inputs}
    if isinstance(inputs, list) and all(isinstance(i, int) for i in inputs):
        return {"prompt_token_ids": inputs}
    if isinstance(inputs, dict):
        return inputs
    raise TypeError(f"Invalid type of inputs for llm.generate: {type(inputs)}")


def TokensPrompt(prompt_token_ids, query_token_ids=None, **kw):
    d = {"prompt_token_ids": prompt_token_ids}
    if query_token_ids is not None:
        d["query_token_ids"] = query_token_ids
    return d


def ConversationMessage(**kw):
    return dict(kw)


def MultimodalData(**kw):
    return dict(kw)


class MultimodalDataTracker:
    def __init__(self, model_type, multimodal_server_config=None):
        self._multimodal_server_config = multimodal_server_config

    def add_data(self, modality, data):
        raise NotImplementedError("stub: multimodal input not supported")

    def placeholder_counts(self):
        return {}

    async def retrieve_all_async(self):
        return None


def apply_chat_template(*, conversation, add_generation_prompt, **kw):
    # Stand-in for the HF jinja chat template (ChatML-like, deterministic).
    s = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in conversation)
    return s + ("<|im_start|>assistant\n" if add_generation_prompt else "")


async def _no_load(*a, **k):
    return None


_pkg(
    "tensorrt_llm.inputs",
    prompt_inputs=prompt_inputs,
    ConversationMessage=ConversationMessage,
    MultimodalData=MultimodalData,
    MultimodalDataTracker=MultimodalDataTracker,
    add_multimodal_placeholders=lambda mt, c, n: c,
    async_load_audio=_no_load,
    async_load_image=_no_load,
    async_load_video=_no_load,
)
_mod("tensorrt_llm.inputs.data", TokensPrompt=TokensPrompt)
_mod(
    "tensorrt_llm.inputs.utils",
    ConversationMessage=ConversationMessage,
    apply_chat_template=apply_chat_template,
)
_mod("tensorrt_llm.inputs.multimodal", MultimodalServerConfig=object)


# ---- serve siblings that need harmony / etcd / responses machinery ----------
class ServerArrivalTimeMiddleware:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            scope.setdefault("state", {})["server_arrival_time"] = get_steady_clock_now_in_seconds()
        await self.app(scope, receive, send)


def get_steady_clock_now_in_seconds():
    import time

    return time.monotonic()


class ConversationHistoryStore:
    async def load_response(self, rid):
        return None


async def _not_impl(*a, **k):
    raise NotImplementedError("stub: responses API machinery not present")


_mod(
    "tensorrt_llm.serve.responses_utils",
    ConversationHistoryStore=ConversationHistoryStore,
    ServerArrivalTimeMiddleware=ServerArrivalTimeMiddleware,
    create_response=_not_impl,
    get_steady_clock_now_in_seconds=get_steady_clock_now_in_seconds,
    process_streaming_events=_not_impl,
    request_preprocess=_not_impl,
)


def _harmony_unavailable(*a, **k):
    raise NotImplementedError("stub: harmony adapter not present")


_mod(
    "tensorrt_llm.serve.harmony_adapter",
    HarmonyAdapter=_harmony_unavailable,
    get_harmony_adapter=_harmony_unavailable,
    maybe_transform_reasoning_effort=lambda x: x,
    handle_non_streaming_response=_harmony_unavailable,
    handle_streaming_response=_harmony_unavailable,
)
_mod("tensorrt_llm.serve.metadata_server", create_metadata_server=lambda cfg: None)
_mod("tensorrt_llm.serve.cluster_storage", create_cluster_storage_client=lambda *a: None)
_mod("tensorrt_llm.serve.disagg_auto_scaling", DisaggClusterWorker=object)
