"""What each flavor's ``/metrics`` reports, from one set of engine statistics.

- vLLM: Prometheus text as vLLM 0.32.0 shows it (recorded in
  ``tests/fixtures/vllm-0.32.0/metrics.txt``): vLLM's own names, types, HELP texts and
  buckets (``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc``,
  ``vllm:time_to_first_token_seconds`` ...), each counter and histogram followed by its
  ``_created`` gauge, labels sorted by name (``engine``, ``model_name``, ...), plus
  ``python_gc_*``/``python_info`` and the ``process_*`` metrics unless the scenario runs vLLM
  in multiprocess mode (where they vanish). The token-count histograms use
  ``build_1_2_5_buckets(max_model_len)`` (``vllm/v1/metrics/loggers.py``).
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
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)


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
        self.request_tpot = Histogram(ITL_BUCKETS)
        self.preemptions = Histogram(PREEMPTION_BUCKETS)
        self.prefill_kv_computed = Histogram(tokens)
        self.success: dict[str, int] = {
            "stop": 0, "length": 0, "abort": 0, "error": 0, "repetition": 0
        }  # fmt: skip
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
    """vLLM 0.32's ``/metrics`` (prometheus_client's text: labels sorted by name, each counter
    and histogram followed by its ``_created`` gauge, values as ``floatToGoString``)."""
    base = {"engine": "0", "model_name": model}
    out: list[str] = []

    def lab(labels: dict[str, str]) -> str:
        return ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))

    def family(name: str, kind: str, help_: str, lines: list[str]) -> None:
        out.append("\n".join([f"# HELP {name} {help_}", f"# TYPE {name} {kind}", *lines]))

    def gauge(name: str, help_: str, values: list[tuple[dict[str, str], float]]) -> None:
        family(name, "gauge", help_, [f"{name}{{{lab(ls)}}} {_go(v)}" for ls, v in values])

    def created(name: str, help_: str, label_sets: list[dict[str, str]]) -> None:
        gauge(f"{name}_created", help_, [(ls, process_start) for ls in label_sets])

    def counter(name: str, help_: str, values: list[tuple[dict[str, str], float]]) -> None:
        family(name, "counter", help_, [f"{name}{{{lab(ls)}}} {_go(v)}" for ls, v in values])
        created(name.removesuffix("_total"), help_, [ls for ls, _ in values])

    def by(label: str, values: dict[str, float]) -> list[tuple[dict[str, str], float]]:
        return [({**base, label: key}, value) for key, value in values.items()]

    def histogram(name: str, help_: str, h: Histogram) -> None:
        lines = []
        acc = 0
        for bound, count in zip((*h.bounds, float("inf")), h.counts, strict=True):
            acc += count
            lines.append(f"{name}_bucket{{{lab({**base, 'le': _le(bound)})}}} {_go(acc)}")
        lines.append(f"{name}_count{{{lab(base)}}} {_go(acc)}")
        lines.append(f"{name}_sum{{{lab(base)}}} {_go(h.sum)}")
        family(name, "histogram", help_, lines)
        created(name, help_, [base])

    _python_metrics(out)
    if not multiprocess:
        _process_metrics(out, snap, process_start)
    mfu = "per GPU (for Model Flops Utilization calculations)."
    counter("vllm:estimated_flops_per_gpu_total",
            f"Estimated number of floating point operations {mfu}", [(base, 0.0)])  # fmt: skip
    counter("vllm:estimated_read_bytes_per_gpu_total",
            f"Estimated number of bytes read from memory {mfu}", [(base, 0.0)])  # fmt: skip
    counter("vllm:estimated_write_bytes_per_gpu_total",
            f"Estimated number of bytes written to memory {mfu}", [(base, 0.0)])  # fmt: skip
    gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
          [(base, snap.running)])  # fmt: skip
    gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
          [(base, snap.waiting)])  # fmt: skip
    gauge("vllm:num_requests_waiting_by_reason",
          "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
          "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV "
          "transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
          by("reason", {"capacity": snap.waiting, "deferred": 0}))  # fmt: skip
    gauge("vllm:engine_sleep_state",
          "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
          "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
          by("sleep_state", {"awake": 1, "weights_offloaded": 0, "discard_all": 0}))  # fmt: skip
    gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
          [(base, snap.kv_used_tokens / snap.kv_capacity_tokens)])  # fmt: skip
    counter("vllm:prefix_cache_queries_total",
            "Prefix cache queries, in terms of number of queried tokens.",
            [(base, stats.prefix_cache_queries)])  # fmt: skip
    counter("vllm:prefix_cache_hits_total",
            "Prefix cache hits, in terms of number of cached tokens.", [(base, 0)])  # fmt: skip
    external = "from KV connector cross-instance cache sharing, in terms of number of"
    counter("vllm:external_prefix_cache_queries_total",
            f"External prefix cache queries {external} queried tokens.", [(base, 0)])  # fmt: skip
    counter("vllm:external_prefix_cache_hits_total",
            f"External prefix cache hits {external} cached tokens.", [(base, 0)])  # fmt: skip
    counter("vllm:mm_cache_queries_total",
            "Multi-modal cache queries, in terms of number of queried items.",
            [(base, 0)])  # fmt: skip
    counter("vllm:mm_cache_hits_total",
            "Multi-modal cache hits, in terms of number of cached items.", [(base, 0)])  # fmt: skip
    counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.",
            [(base, 0)])  # fmt: skip
    counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.",
            [(base, stats.prompt_tokens_total)])  # fmt: skip
    counter("vllm:prompt_tokens_by_source_total", "Number of prompt tokens by source.",
            by("source", {"local_compute": stats.prompt_tokens_total, "local_cache_hit": 0,
                          "external_kv_transfer": 0}))  # fmt: skip
    counter("vllm:prompt_tokens_cached_total",
            "Number of cached prompt tokens (local + external).", [(base, 0)])  # fmt: skip
    counter("vllm:prompt_tokens_cached_by_source_total",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), "
            "host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
            "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
            "vllm:external_prefix_cache_hits.",
            by("source", dict.fromkeys(("device", "host", "p2p", "disk",
                                        "external_unspecified"), 0)))  # fmt: skip
    counter("vllm:generation_tokens_total", "Number of generation tokens processed.",
            [(base, stats.generation_tokens_total)])  # fmt: skip
    counter("vllm:request_success_total", "Count of successfully processed requests.",
            by("finished_reason", dict(stats.success)))  # fmt: skip
    counter("vllm:admission_rejections_total",
            "Number of admission attempts rejected by a queue limit, by reason.",
            [({"model_name": model, "reason": r}, 0)
             for r in ("max_num_queued_reqs", "max_num_queued_tokens")])  # fmt: skip
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
    histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
              stats.itl)  # fmt: skip
    histogram("vllm:request_time_per_output_token_seconds",
              "Histogram of time_per_output_token_seconds per request.",
              stats.request_tpot)  # fmt: skip
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
    histogram("vllm:request_num_preemptions",
              "Histogram of the number of times a request was preempted.",
              stats.preemptions)  # fmt: skip
    histogram("vllm:request_prefill_kv_computed_tokens",
              "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
              stats.prefill_kv_computed)  # fmt: skip
    gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
          [({**_cache_config(snap), "engine": "0"}, 1.0)])  # fmt: skip
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


def _cache_config(snap: EngineSnapshot) -> dict[str, str]:
    """``vllm:cache_config_info``'s labels as vLLM 0.32 (CPU build) shows them, with the
    simulated cache's block size and block count."""
    blocks = snap.kv_capacity_tokens // snap.kv_block_tokens
    block = str(snap.kv_block_tokens)
    return {
        "_block_size_resolved": "True", "block_size": block, "cache_dtype": "auto",
        "cache_hit_alignment_tokens": "None", "effective_attention_block_size": block,
        "enable_mamba_shared_prefix_checkpoint": "False", "enable_prefix_caching": "True",
        "gpu_memory_utilization": "0.92", "hash_block_size": "None",
        "is_attention_free": "False", "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None", "kv_cache_max_concurrency": "None",
        "kv_cache_memory_bytes": "None", "kv_cache_size_tokens": str(snap.kv_capacity_tokens),
        "kv_offloading_backend": "native", "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False", "mamba_block_size": "None",
        "mamba_cache_dtype": "auto", "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None", "mamba_ssm_cache_dtype": "auto",
        "num_cpu_blocks": "None", "num_gpu_blocks": str(blocks),
        "num_gpu_blocks_override": "None", "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256", "prefix_match_unit": "None",
        "replayssm_buffer_len": "16", "skip_page_size_padded": "None",
        "sliding_window": "None", "swa_bounded_replay": "True", "use_kda_recoverssm": "False",
        "use_replayssm": "False", "user_specified_block_size": "False",
    }  # fmt: skip


def _python_metrics(out: list[str]) -> None:
    """prometheus_client's GC and platform collectors, from this process."""
    import gc
    import platform

    gc_stats = gc.get_stats()
    for name, help_, key in (
        ("python_gc_objects_collected_total", "Objects collected during gc", "collected"),
        ("python_gc_objects_uncollectable_total", "Uncollectable objects found during GC",
         "uncollectable"),
        ("python_gc_collections_total", "Number of times this generation was collected",
         "collections"),
    ):  # fmt: skip
        lines = [f"# HELP {name} {help_}", f"# TYPE {name} counter"]
        lines += [f'{name}{{generation="{i}"}} {_go(g[key])}' for i, g in enumerate(gc_stats)]
        out.append("\n".join(lines))
    major, minor, patch = platform.python_version_tuple()
    info = (
        f'implementation="{platform.python_implementation()}",major="{major}",'
        f'minor="{minor}",patchlevel="{patch}",version="{platform.python_version()}"'
    )
    out.append(
        "# HELP python_info Python platform information\n# TYPE python_info gauge\n"
        f"python_info{{{info}}} 1.0"
    )


def _process_metrics(out: list[str], snap: EngineSnapshot, process_start: float) -> None:
    """prometheus_client's process collector (the simulated memory, this process's CPU)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    try:
        fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        fds = 0
    max_fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    for name, kind, help_, value in (
        ("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.",
         float(int((snap.cpu_mb + 4096) * MB))),
        ("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
         float(int(snap.cpu_mb * MB))),
        ("process_start_time_seconds", "gauge",
         "Start time of the process since unix epoch in seconds.", round(process_start, 2)),
        ("process_cpu_seconds_total", "counter",
         "Total user and system CPU time spent in seconds.", usage.ru_utime + usage.ru_stime),
        ("process_open_fds", "gauge", "Number of open file descriptors.", float(fds)),
        ("process_max_fds", "gauge", "Maximum number of open file descriptors.",
         float(max_fds)),
    ):  # fmt: skip
        out.append(f"# HELP {name} {help_}\n# TYPE {name} {kind}\n{name} {_go(value)}")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _le(bound: float) -> str:
    """A bucket bound as prometheus_client writes it (``floatToGoString``)."""
    return _go(bound)


def _go(value: float) -> str:
    """A value as prometheus_client writes it (``floatToGoString``)."""
    bound = float(value)
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
