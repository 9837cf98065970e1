# mypy: ignore-errors
# ruff: noqa
"""A fake generator object exposing the attributes that openai_server.py and
postprocess_handlers.py read from tensorrt_llm.LLM / GenerationResult."""

import asyncio
import itertools
import re
import time
from types import SimpleNamespace

import trtllm_stubs as S
from tensorrt_llm.metrics.enums import MetricNames

# Deterministic word-level "vocabulary"; ids >= 100 are prompt tokens.
SCRIPT = ["Hello", ",", " world", "!", " This", " is", " a", " stub", "."]
ALTS = [" there", " the", " I", " you", " it"]
VOCAB = SCRIPT + ALTS


class StubTokenizer:
    def __init__(self, name_or_path):
        self.tokenizer = SimpleNamespace(vocab_size=32000, name_or_path=name_or_path)

    def encode(self, text, add_special_tokens=True, **kw):
        pieces = re.findall(r"\s*\S+", text)
        return ([1] if add_special_tokens else []) + [
            100 + (sum(map(ord, p)) % 30000) for p in pieces
        ]

    def decode(self, ids, **kw):
        if isinstance(ids, int):
            ids = [ids]
        return "".join(VOCAB[i] if i < len(VOCAB) else "" for i in ids)


class StubCompletionOutput:
    """Mirror of tensorrt_llm.executor.result.CompletionOutput."""

    def __init__(self, index):
        self.index = index
        self.text = ""
        self.token_ids = []
        self.cumulative_logprob = None
        self.logprobs = []
        self.finish_reason = None
        self.stop_reason = None
        self.disaggregated_params = None
        self.request_perf_metrics = None
        self._last_text_len = 0
        self._last_token_ids_len = 0
        self._last_logprobs_len = 0
        self._postprocess_result = None

    length = property(lambda s: len(s.token_ids))
    text_diff = property(lambda s: s.text[s._last_text_len :])
    token_ids_diff = property(lambda s: s.token_ids[s._last_token_ids_len :])
    logprobs_diff = property(lambda s: s.logprobs[s._last_logprobs_len :])


class StubResult(S.GenerationResult):
    """Mirror of GenerationResult: async-iterable, awaitable, one token/step."""

    _ids = itertools.count(1)

    def __init__(self, prompt_token_ids, sampling_params, streaming, tokenizer, step_delay):
        self.request_id = next(self._ids)
        self.id = self.request_id
        self.prompt_token_ids = prompt_token_ids
        self.sampling_params = sampling_params
        self._streaming = streaming
        self._tok = tokenizer
        self._delay = step_delay
        self.cached_tokens = 0
        self.avg_decoded_tokens_per_iter = None
        self.context_logits = None
        self.decoding_iter = 0
        self.metrics_dict = {}
        self._done = False
        self._aborted = False
        self.outputs = [StubCompletionOutput(i) for i in range(sampling_params.n)]
        self._budget = min(len(SCRIPT), sampling_params.max_tokens or len(SCRIPT))
        self._t0 = time.time()

    finished = property(lambda s: s._done)

    def abort(self):
        self._aborted = True

    def _step(self):
        k = self.sampling_params.logprobs
        for out in self.outputs:
            out._last_text_len = len(out.text)
            out._last_token_ids_len = len(out.token_ids)
            out._last_logprobs_len = len(out.logprobs)
            tid = len(out.token_ids)  # token id == position in SCRIPT
            out.token_ids.append(tid)
            if k:  # PyTorch backend: list[dict[token_id, Logprob]]
                d = {tid: S.Logprob(logprob=-0.25, rank=1)}
                for r, alt in enumerate(range(len(SCRIPT), len(VOCAB))[: k - 1]):
                    d[alt] = S.Logprob(logprob=-1.5 - r, rank=r + 2)
                out.logprobs.append(d)
            elif self.sampling_params._return_log_probs:  # TRT backend
                out.logprobs.append(-0.25)
            out.text = self._tok.decode(out.token_ids)
            if out.length >= self._budget:
                out.finish_reason = "stop" if out.length >= len(SCRIPT) else "length"
        self.decoding_iter += 1
        if all(o.finish_reason for o in self.outputs):
            self._done = True
            e2e = time.time() - self._t0
            self.metrics_dict = {
                "finished_reason": self.outputs[0].finish_reason,
                MetricNames.TTFT: 0.01,
                MetricNames.TPOT: 0.005,
                MetricNames.E2E: e2e,
                MetricNames.REQUEST_QUEUE_TIME: 0.001,
            }

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._done:
            raise StopAsyncIteration
        if self._streaming:
            await asyncio.sleep(self._delay)
            self._step()
        else:
            while not self._done:
                await asyncio.sleep(self._delay)
                self._step()
        return self

    async def aresult(self):
        while not self._done:
            await self.__anext__()
        return self

    def __await__(self):
        return self.aresult().__await__()


class StubLLM:
    """Stands in for tensorrt_llm.LLM (PyTorch backend) as seen by OpenAIServer."""

    def __init__(self, model_dir, step_delay=0.01, backend="pytorch"):
        self._hf_model_dir = model_dir
        self.tokenizer = StubTokenizer(model_dir)
        self.llm_id = "stub-llm"
        self.args = SimpleNamespace(
            trust_remote_code=False,
            return_perf_metrics=True,
            perf_metrics_max_requests=0,
            num_postprocess_workers=0,
            backend=backend,
            gather_generation_logits=False,
            reasoning_parser=None,
        )
        self._delay = step_delay
        self._iter = 0

    def input_processor(self, prompt, sampling_params):
        return self.tokenizer.encode(prompt["prompt"]), None

    def generate_async(self, inputs, sampling_params=None, streaming=False, **kw):
        sampling_params = sampling_params or S.SamplingParams()
        if "prompt_token_ids" in inputs:
            ids = list(inputs["prompt_token_ids"])
        else:
            ids = self.tokenizer.encode(
                inputs["prompt"],
                add_special_tokens=getattr(sampling_params, "add_special_tokens", True),
            )
        return StubResult(ids, sampling_params, streaming, self.tokenizer, self._delay)

    async def get_stats_async(self, timeout=2):
        # Shape modelled on PyTorch-backend iteration stats; values are fake.
        for _ in range(2):
            self._iter += 1
            yield {
                "iter": self._iter,
                "iterLatencyMS": 1.5,
                "newActiveRequestsQueueLatencyMS": 0.0,
                "numActiveRequests": 0,
                "numQueuedRequests": 0,
                "numCompletedRequests": 0,
                "maxNumActiveRequests": 8,
                "gpuMemUsage": 0,
                "cpuMemUsage": 0,
                "pinnedMemUsage": 0,
                "timestamp": "stub",
                "inflightBatchingStats": {
                    "numContextRequests": 0,
                    "numCtxTokens": 0,
                    "numGenRequests": 0,
                    "numPausedRequests": 0,
                    "numScheduledRequests": 0,
                    "microBatchId": 0,
                    "avgNumDecodedTokensPerIter": 0.0,
                },
                "kvCacheStats": {
                    "maxNumBlocks": 0,
                    "freeNumBlocks": 0,
                    "usedNumBlocks": 0,
                    "tokensPerBlock": 32,
                    "allocTotalBlocks": 0,
                    "allocNewBlocks": 0,
                    "reusedBlocks": 0,
                    "missedBlocks": 0,
                    "cacheHitRate": 0.0,
                },
            }

    async def get_kv_cache_events_async(self, timeout=2):
        if False:
            yield None

    def shutdown(self):
        pass
