"""What each flavor's ``/metrics`` reports, from one set of engine statistics.

- vLLM: Prometheus text with vLLM's own names (``vllm:num_requests_running``,
  ``vllm:kv_cache_usage_perc``, ``vllm:time_to_first_token_seconds`` ...) labelled
  ``model_name`` and ``engine``, plus the ``process_*`` metrics unless the scenario runs vLLM in
  multiprocess mode (where they vanish).
- TensorRT-LLM: a JSON list of iteration stats (``iter``, ``iterLatencyMS``,
  ``numActiveRequests``, ``numQueuedRequests``, ``gpuMemUsage``, ``cpuMemUsage``,
  ``kvCacheStats``, ``inflightBatchingStats`` ...), drained by each read, empty when the engine
  has not stepped since the last read.

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
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)

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

    def __init__(self) -> None:
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(REQUEST_BUCKETS)
        self.queue = Histogram(REQUEST_BUCKETS)
        self.prefill = Histogram(REQUEST_BUCKETS)
        self.decode = Histogram(REQUEST_BUCKETS)
        self.prompt_tokens = Histogram(TOKEN_BUCKETS)
        self.generation_tokens = Histogram(TOKEN_BUCKETS)
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.success: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
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
    labels = f'engine="0",model_name="{model}"'
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
            le = "+Inf" if bound == float("inf") else repr(float(bound))
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
    histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
              stats.ttft)  # fmt: skip
    histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
              stats.itl)  # fmt: skip
    histogram("vllm:e2e_request_latency_seconds",
              "Histogram of e2e request latency in seconds.", stats.e2e)  # fmt: skip
    histogram("vllm:request_queue_time_seconds",
              "Histogram of time spent in WAITING phase for request.", stats.queue)  # fmt: skip
    histogram("vllm:request_prefill_time_seconds",
              "Histogram of time spent in PREFILL phase for request.", stats.prefill)  # fmt: skip
    histogram("vllm:request_decode_time_seconds",
              "Histogram of time spent in DECODE phase for request.", stats.decode)  # fmt: skip
    blocks = snap.kv_capacity_tokens // snap.kv_block_tokens
    gauge(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        1.0,
        f'block_size="{snap.kv_block_tokens}",engine="0",num_gpu_blocks="{blocks}"',
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
    return stat


def drain_trt(stats: EngineStats) -> list[dict[str, Any]]:
    out = list(stats.iterations)
    stats.iterations.clear()
    return out
