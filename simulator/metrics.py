"""What each flavor's ``/metrics`` reports, from one set of engine statistics.

- vLLM: Prometheus text with vLLM's own names, types, HELP texts and buckets
  (``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc``,
  ``vllm:time_to_first_token_seconds`` ...) labelled ``model_name`` then ``engine``, plus the
  ``process_*`` metrics unless the scenario runs vLLM in multiprocess mode (where they vanish).
  Checked against vLLM 0.11's ``vllm/v1/metrics/loggers.py`` (PrometheusStatLogger): the
  metric set is the one shown without ``--show-hidden-metrics-for-version``, including the
  deprecated-in-0.11 ``vllm:time_per_output_token_seconds`` (same observations as
  ``vllm:inter_token_latency_seconds``); the token-count histograms use
  ``build_1_2_5_buckets(max_model_len)``.
- TensorRT-LLM: a JSON list of iteration stats (``iter``, ``iterLatencyMS``,
  ``numActiveRequests``, ``numQueuedRequests``, ``gpuMemUsage``, ``cpuMemUsage``,
  ``kvCacheStats``, ``inflightBatchingStats`` ...), drained by each read, empty when the engine
  has not stepped since the last read.
- TensorRT-LLM's optional ``/prometheus/metrics`` (``return_perf_metrics: true``): the
  ``trtllm_*`` metrics of ``tensorrt_llm/metrics/collector.py`` (MetricsCollector, as
  ``serve/openai_server.py`` creates it: labels ``model_name="undefined"``,
  ``engine_type="undefined"``), exposed through prometheus_client's multiprocess collector
  (no ``process_*``, no ``_created``; a series appears once it has a value).

Under time acceleration both add a clearly named marker: ``sim:time_scale`` /
``sim:elapsed_seconds`` gauges (vLLM) and a ``simTimeScale`` key on every stat (TensorRT-LLM).
"""

from __future__ import annotations

import bisect
import os
import resource
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

MB = 1024 * 1024

# Bucket bounds as vLLM declares them.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_BUCKETS = (1, 2, 5, 10, 20)


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50 ... up to ``max_value``."""
    out: list[int] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(value)
        exponent += 1


TRT_STATS_MAX = 1000
"""TensorRT-LLM keeps at most this many iteration stats between reads."""


class Histogram:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.sum += value * times


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """The gauges at one moment, as the engine sees them."""

    running: int
    waiting: int
    kv_used_tokens: int
    kv_capacity_tokens: int
    kv_block_tokens: int
    cpu_mb: float
    gpu_mb: float


class EngineStats:
    """Counters, histograms and TensorRT-LLM iteration stats, fed by the engine loop."""

    def __init__(self, max_model_len: int = 8192) -> None:
        tokens = build_1_2_5_buckets(max_model_len)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(REQUEST_BUCKETS)
        self.queue = Histogram(REQUEST_BUCKETS)
        self.inference = Histogram(REQUEST_BUCKETS)
        self.prefill = Histogram(REQUEST_BUCKETS)
        self.decode = Histogram(REQUEST_BUCKETS)
        self.prompt_tokens = Histogram(tokens)
        self.generation_tokens = Histogram(tokens)
        self.max_generation_tokens = Histogram(tokens)
        self.max_tokens_param = Histogram(tokens)
        self.n_param = Histogram(N_BUCKETS)
        self.iteration_tokens = Histogram(ITERATION_TOKEN_BUCKETS)
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.prefix_cache_queries = 0
        self.success: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
        # TensorRT-LLM's MetricsCollector (only shown with return_perf_metrics)
        self.trt_success: dict[str, int] = {}
        self.trt_e2e = Histogram(REQUEST_BUCKETS)
        self.trt_ttft = Histogram(TTFT_BUCKETS)
        self.trt_tpot = Histogram(ITL_BUCKETS)
        self.trt_queue = Histogram(REQUEST_BUCKETS)
        self.trt_kv: tuple[float, float] | None = None
        """(cache hit rate, utilization) from the last iteration stat, once there is one."""
        self.iterations: deque[dict[str, Any]] = deque(maxlen=TRT_STATS_MAX)
        self.iteration = 0
        self.completed_since_iter = 0


def render_vllm(
    stats: EngineStats,
    snap: EngineSnapshot,
    *,
    model: str,
    process_start: float,
    multiprocess: bool,
    time_scale: float,
    sim_elapsed: float,
) -> str:
    labels = f'model_name="{_escape(model)}",engine="0"'
    out: list[str] = []

    def gauge(name: str, help_: str, value: float, lab: str = labels) -> None:
        out.append(f"# HELP {name} {help_}\n# TYPE {name} gauge\n{name}{{{lab}}} {value}")

    def counter(name: str, help_: str, value: float) -> None:
        out.append(f"# HELP {name} {help_}\n# TYPE {name} counter\n{name}{{{labels}}} {value}")

    def histogram(name: str, help_: str, h: Histogram) -> None:
        lines = [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
        acc = 0
        for bound, count in zip((*h.bounds, float("inf")), h.counts, strict=True):
            acc += count
            le = _le(bound)
            lines.append(f'{name}_bucket{{{labels},le="{le}"}} {float(acc)}')
        lines.append(f"{name}_count{{{labels}}} {float(acc)}")
        lines.append(f"{name}_sum{{{labels}}} {h.sum}")
        out.append("\n".join(lines))

    if not multiprocess:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        try:
            fds = len(os.listdir("/proc/self/fd"))
        except OSError:
            fds = 0
        out.append(
            "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
            "# TYPE process_virtual_memory_bytes gauge\n"
            f"process_virtual_memory_bytes {float(int((snap.cpu_mb + 4096) * MB))}\n"
            "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
            "# TYPE process_resident_memory_bytes gauge\n"
            f"process_resident_memory_bytes {float(int(snap.cpu_mb * MB))}\n"
            "# HELP process_start_time_seconds Start time of the process since unix epoch in"
            " seconds.\n"
            "# TYPE process_start_time_seconds gauge\n"
            f"process_start_time_seconds {process_start:.2f}\n"
            "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
            "# TYPE process_cpu_seconds_total counter\n"
            f"process_cpu_seconds_total {usage.ru_utime + usage.ru_stime:.2f}\n"
            "# HELP process_open_fds Number of open file descriptors.\n"
            "# TYPE process_open_fds gauge\n"
            f"process_open_fds {float(fds)}"
        )
    gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
          float(snap.running))  # fmt: skip
    gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
          float(snap.waiting))  # fmt: skip
    gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
          snap.kv_used_tokens / snap.kv_capacity_tokens)  # fmt: skip
    counter("vllm:prefix_cache_queries_total",
            "Prefix cache queries, in terms of number of queried tokens.",
            float(stats.prefix_cache_queries))  # fmt: skip
    counter("vllm:prefix_cache_hits_total",
            "Prefix cache hits, in terms of number of cached tokens.", 0.0)  # fmt: skip
    counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", 0.0)
    counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.",
            float(stats.prompt_tokens_total))  # fmt: skip
    counter("vllm:generation_tokens_total", "Number of generation tokens processed.",
            float(stats.generation_tokens_total))  # fmt: skip
    lines = [
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
    ]
    for reason, n in stats.success.items():
        lines.append(
            f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} {float(n)}'
        )
    out.append("\n".join(lines))
    histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
              stats.prompt_tokens)  # fmt: skip
    histogram("vllm:request_generation_tokens", "Number of generation tokens processed.",
              stats.generation_tokens)  # fmt: skip
    histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
              stats.iteration_tokens)  # fmt: skip
    histogram("vllm:request_max_num_generation_tokens",
              "Histogram of maximum number of requested generation tokens.",
              stats.max_generation_tokens)  # fmt: skip
    histogram("vllm:request_params_n", "Histogram of the n request parameter.",
              stats.n_param)  # fmt: skip
    histogram("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
              stats.max_tokens_param)  # fmt: skip
    histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
              stats.ttft)  # fmt: skip
    histogram("vllm:time_per_output_token_seconds",
              "Histogram of time per output token in seconds."
              "DEPRECATED: Use vllm:inter_token_latency_seconds instead.", stats.itl)  # fmt: skip
    histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
              stats.itl)  # fmt: skip
    histogram("vllm:e2e_request_latency_seconds",
              "Histogram of e2e request latency in seconds.", stats.e2e)  # fmt: skip
    histogram("vllm:request_queue_time_seconds",
              "Histogram of time spent in WAITING phase for request.", stats.queue)  # fmt: skip
    histogram("vllm:request_inference_time_seconds",
              "Histogram of time spent in RUNNING phase for request.",
              stats.inference)  # fmt: skip
    histogram("vllm:request_prefill_time_seconds",
              "Histogram of time spent in PREFILL phase for request.", stats.prefill)  # fmt: skip
    histogram("vllm:request_decode_time_seconds",
              "Histogram of time spent in DECODE phase for request.", stats.decode)  # fmt: skip
    blocks = snap.kv_capacity_tokens // snap.kv_block_tokens
    gauge(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        1.0,
        f'block_size="{snap.kv_block_tokens}",num_gpu_blocks="{blocks}",engine="0"',
    )
    if time_scale != 1.0:
        out.append(
            "# HELP sim:time_scale SIMULATOR: simulated seconds per real second (accelerated).\n"
            "# TYPE sim:time_scale gauge\n"
            f"sim:time_scale {time_scale}\n"
            "# HELP sim:elapsed_seconds SIMULATOR: simulated seconds since the simulator start.\n"
            "# TYPE sim:elapsed_seconds gauge\n"
            f"sim:elapsed_seconds {sim_elapsed:.3f}"
        )
    return "\n".join(out) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _le(bound: float) -> str:
    """A bucket bound as prometheus_client writes it (``floatToGoString``)."""
    if bound == float("inf"):
        return "+Inf"
    text = repr(float(bound))
    dot = text.find(".")
    if bound > 0 and dot > 6:  # 1000000.0 -> 1e+06, as prometheus_client does
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return text


TRT_LABELS = 'model_name="undefined",engine_type="undefined"'
"""What ``serve/openai_server.py`` passes to ``MetricsCollector``."""


def render_trt_prometheus(stats: EngineStats, *, pid: int) -> str:
    """TensorRT-LLM's ``/prometheus/metrics`` (multiprocess registry, so no ``_created``,
    no ``process_*``, gauges carry a ``pid`` label, and a series exists once observed)."""
    out: list[str] = []
    if stats.trt_success:
        lines = [
            "# HELP trtllm_request_success_total Count of successfully processed requests.",
            "# TYPE trtllm_request_success_total counter",
        ]
        for reason, n in sorted(stats.trt_success.items()):
            lines.append(
                f'trtllm_request_success_total{{{TRT_LABELS},finished_reason="{reason}"}}'
                f" {float(n)}"
            )
        out.append("\n".join(lines))

    def histogram(name: str, help_: str, h: Histogram) -> None:
        if sum(h.counts) == 0:
            return
        lines = [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
        acc = 0
        for bound, count in zip((*h.bounds, float("inf")), h.counts, strict=True):
            acc += count
            lines.append(f'{name}_bucket{{{TRT_LABELS},le="{_le(bound)}"}} {float(acc)}')
        lines.append(f"{name}_count{{{TRT_LABELS}}} {float(acc)}")
        lines.append(f"{name}_sum{{{TRT_LABELS}}} {h.sum}")
        out.append("\n".join(lines))

    histogram("trtllm_e2e_request_latency_seconds",
              "Histogram of end to end request latency in seconds.", stats.trt_e2e)  # fmt: skip
    histogram("trtllm_time_to_first_token_seconds",
              "Histogram of time to first token in seconds.", stats.trt_ttft)  # fmt: skip
    histogram("trtllm_time_per_output_token_seconds",
              "Histogram of time per output token in seconds.", stats.trt_tpot)  # fmt: skip
    histogram("trtllm_request_queue_time_seconds",
              "Histogram of time spent in WAITING phase for request.", stats.trt_queue)  # fmt: skip
    if stats.trt_kv is not None:
        hit, util = stats.trt_kv
        for name, help_, value in (
            ("trtllm_kv_cache_hit_rate", "KV cache hit rate", hit),
            ("trtllm_kv_cache_utilization", "KV cache utilization", util),
        ):
            out.append(
                f"# HELP {name} {help_}\n# TYPE {name} gauge\n"
                f'{name}{{{TRT_LABELS},pid="{pid}"}} {float(value)}'
            )
    return "\n".join(out) + "\n" if out else ""


def trt_iteration_stat(
    stats: EngineStats,
    snap: EngineSnapshot,
    *,
    latency_ms: float,
    queue_latency_ms: float,
    scheduled: int,
    context_requests: int,
    context_tokens: int,
    max_active: int,
    sim_time: float,
    time_scale: float,
) -> dict[str, Any]:
    """One TensorRT-LLM iteration stat (the executor's IterationStats as JSON)."""
    stats.iteration += 1
    block = snap.kv_block_tokens
    max_blocks = snap.kv_capacity_tokens // block
    used_blocks = min(max_blocks, -(-snap.kv_used_tokens // block))
    stat: dict[str, Any] = {
        "cpuMemUsage": int(snap.cpu_mb * MB),
        "gpuMemUsage": int(snap.gpu_mb * MB),
        "pinnedMemUsage": 0,
        "iter": stats.iteration,
        "iterLatencyMS": round(latency_ms, 4),
        "newActiveRequestsQueueLatencyMS": round(queue_latency_ms, 4),
        "maxBatchSizeRuntime": max_active,
        "maxNumActiveRequests": max_active,
        "numActiveRequests": snap.running,
        "numQueuedRequests": snap.waiting,
        "numCompletedRequests": stats.completed_since_iter,
        "timestamp": datetime.fromtimestamp(sim_time, UTC).strftime("%m-%d-%Y %H:%M:%S"),
        "kvCacheStats": {
            "maxNumBlocks": max_blocks,
            "freeNumBlocks": max_blocks - used_blocks,
            "usedNumBlocks": used_blocks,
            "tokensPerBlock": block,
            "allocTotalBlocks": used_blocks,
            "allocNewBlocks": -(-context_tokens // block),
            "reusedBlocks": 0,
            "missedBlocks": -(-context_tokens // block),
            "cacheHitRate": 0.0,
        },
        "inflightBatchingStats": {
            "numScheduledRequests": scheduled,
            "numContextRequests": context_requests,
            "numGenRequests": scheduled - context_requests,
            "numPausedRequests": 0,
            "numCtxTokens": context_tokens,
            "microBatchId": 0,
            "avgNumDecodedTokensPerIter": 1.0,
        },
    }
    if time_scale != 1.0:
        stat["simTimeScale"] = time_scale
    stats.completed_since_iter = 0
    stats.trt_kv = (0.0, used_blocks / max_blocks if max_blocks else 0.0)
    return stat


def drain_trt(stats: EngineStats) -> list[dict[str, Any]]:
    out = list(stats.iterations)
    stats.iterations.clear()
    return out
