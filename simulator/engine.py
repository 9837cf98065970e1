"""The simulated engine core: continuous batching paced by asyncio sleeps.

One loop task steps the engine like vLLM's or TensorRT-LLM's scheduler does: each iteration it
admits waiting requests while the running set and the KV cache allow (a request reserves its
prompt plus its output budget; beyond capacity it queues), sleeps for the iteration's modelled
time, then advances every running sequence by one token (newly admitted ones get their first
token: prefill). Iteration time::

    decode_ms * drift * (1 + batch_slowdown * (running_seqs - 1))
      + if any request was admitted: prefill_base_ms + prefill_per_token_ms * their prompt tokens
    all times log-normal noise, times warmup_factor during warmup_s after a (re)start

Answers are computed when a request is submitted (:mod:`simulator.generate`); the loop only
counts how many tokens of each are ready and wakes the request's handler. A hung engine (fault)
does not step, so streams stop mid-way and new requests wait.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from simulator.faults import FaultRuntime
from simulator.generate import Completion
from simulator.metrics import EngineSnapshot, EngineStats, trt_iteration_stat
from simulator.scenario import Scenario

MAX_LAG_S = 0.05
"""How far behind its modelled timeline the loop may run before it gives up catching up."""


@dataclass(eq=False, slots=True)
class Sequence:
    """One choice being generated."""

    completion: Completion
    produced: int = 0
    sent: int = 0
    finish_sent: bool = False

    @property
    def total(self) -> int:
        return len(self.completion.tokens)

    @property
    def done(self) -> bool:
        return self.produced >= len(self.completion.tokens)


@dataclass(eq=False)
class Job:
    """One HTTP request's work: its sequences and its timeline (monotonic seconds)."""

    id: str
    seqs: list[Sequence]
    prompt_tokens: int
    reserve_tokens: int
    n: int = 1
    """The request's ``n`` (vLLM's ``vllm:request_params_n``)."""
    max_tokens: int | None = None
    """The request's effective ``max_tokens`` (vLLM's ``vllm:request_params_max_tokens``)."""
    arrival: float = field(default_factory=time.monotonic)
    scheduled_at: float | None = None
    first_token_at: float | None = None
    finished: bool = False
    aborted: bool = False
    event: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def generated(self) -> int:
        return sum(s.produced for s in self.seqs)


class Engine:
    def __init__(
        self,
        scenario: Scenario,
        faults: FaultRuntime,
        stats: EngineStats,
        *,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.scenario = scenario
        self.lat = scenario.latency
        self.faults = faults
        self.stats = stats
        self.rng = rng or random.Random(scenario.seed)
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []
        self.kv_reserved = 0
        self._wake = asyncio.Event()
        self._sleep = sleep
        self._next_start: float | None = None

    # -- requests ------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        self.waiting.append(job)
        self._wake.set()

    def abort(self, job: Job) -> None:
        """The client went away: free its slot (counted as an abort)."""
        if job.finished or job.aborted:
            return
        job.aborted = True
        if job in self.running:
            self.running.remove(job)
            self.kv_reserved -= job.reserve_tokens
            self.stats.success["abort"] += 1
        else:
            try:
                self.waiting.remove(job)
            except ValueError:
                pass
            else:
                self.stats.success["abort"] += 1

    def inflight_ids(self) -> list[str]:
        return [j.id for j in self.running]

    # -- state ---------------------------------------------------------------------------

    def running_seqs(self) -> int:
        return sum(1 for j in self.running for s in j.seqs if not s.done)

    def snapshot(self) -> EngineSnapshot:
        used = sum(j.prompt_tokens + j.generated for j in self.running)
        cpu, gpu = self.faults.memory_mb()
        return EngineSnapshot(
            running=len(self.running),
            waiting=len(self.waiting),
            kv_used_tokens=min(used, self.lat.kv_capacity_tokens),
            kv_capacity_tokens=self.lat.kv_capacity_tokens,
            kv_block_tokens=self.lat.kv_block_tokens,
            cpu_mb=cpu,
            gpu_mb=gpu,
        )

    # -- the loop ------------------------------------------------------------------------

    def _admit(self) -> list[Job]:
        admitted: list[Job] = []
        seqs = self.running_seqs()
        while self.waiting:
            job = self.waiting[0]
            fits_kv = self.kv_reserved + job.reserve_tokens <= self.lat.kv_capacity_tokens
            fits_batch = seqs + len(job.seqs) <= self.lat.max_num_seqs
            # An idle engine always takes the head request, however large, or it would wait
            # forever.
            if (not self.running and not admitted) or (fits_kv and fits_batch):
                self.waiting.popleft()
                self.kv_reserved += job.reserve_tokens
                seqs += len(job.seqs)
                admitted.append(job)
                self.running.append(job)
            else:
                break
        return admitted

    def iteration_ms(self, admitted: list[Job]) -> float:
        seqs = max(1, self.running_seqs())
        decode = (
            self.lat.decode_ms
            * self.faults.decode_multiplier()
            * (1.0 + self.lat.batch_slowdown * (seqs - 1))
        )
        prefill = 0.0
        if admitted:  # one batched prefill: a fixed cost plus a cost per prompt token
            prefill = self.lat.prefill_base_ms + self.lat.prefill_per_token_ms * sum(
                j.prompt_tokens for j in admitted
            )
        noise = math.exp(self.rng.gauss(0.0, self.lat.noise)) if self.lat.noise else 1.0
        warm = 1.0
        if self.lat.warmup_factor != 1.0 and self.lat.warmup_s > 0.0:
            age = self.faults.clock.elapsed() - self.faults.process_start
            if age < self.lat.warmup_s:
                warm = self.lat.warmup_factor
        return (decode + prefill) * noise * warm

    async def run(self) -> None:
        while True:
            if self.faults.hang_active():
                self._next_start = None
                await asyncio.sleep(0.005)
                continue
            if not self.running and not self.waiting:
                self._next_start = None
                self._wake.clear()
                await self._wake.wait()
                continue
            await self.step()

    async def step(self) -> None:
        """One iteration. Iterations are laid end to end on the modelled timeline (each
        starts when the previous one should have ended), so the time spent handing tokens
        to the streams does not add to the pace; a loop running behind by more than
        :data:`MAX_LAG_S` (overload) restarts the timeline from now."""
        now = time.monotonic()
        started = self._next_start
        if started is None or now - started > MAX_LAG_S:
            started = now
        admitted = self._admit()
        for job in admitted:
            job.scheduled_at = max(started, job.arrival)
        ms = self.iteration_ms(admitted)
        end = started + ms / 1000.0
        self._next_start = end
        await self._sleep(max(0.0, end - time.monotonic()))
        now = time.monotonic()
        took = now - started
        stats = self.stats
        produced = 0
        prefilled = sum(j.prompt_tokens for j in admitted)
        stats.prefix_cache_queries += prefilled
        for job in list(self.running):
            if job.aborted:
                continue
            for seq in job.seqs:
                if seq.produced < seq.total:
                    seq.produced += 1
                    produced += 1
            if job.first_token_at is None:
                job.first_token_at = now
                stats.ttft.observe(now - job.arrival)
                # vLLM counts prompt tokens and n when the prefill's output arrives
                stats.prompt_tokens_total += job.prompt_tokens
                stats.n_param.observe(job.n)
            else:
                stats.itl.observe(took)
            if all(s.done for s in job.seqs):
                self._finish(job, now)
            job.event.set()
        stats.generation_tokens_total += produced
        stats.iteration_tokens.observe(prefilled + produced)
        queue_ms = (
            sum(started - j.arrival for j in admitted) / len(admitted) * 1000.0 if admitted else 0.0
        )
        if self.scenario.flavor != "trtllm":
            return
        stats.iterations.append(
            trt_iteration_stat(
                stats,
                self.snapshot(),
                latency_ms=ms,
                queue_latency_ms=queue_ms,
                scheduled=len(self.running),
                context_requests=len(admitted),
                context_tokens=sum(j.prompt_tokens for j in admitted),
                max_active=self.lat.max_num_seqs,
                sim_time=self.faults.clock.now(),
                time_scale=self.scenario.time_scale,
            )
        )

    def _finish(self, job: Job, now: float) -> None:
        job.finished = True
        self.running.remove(job)
        self.kv_reserved -= job.reserve_tokens
        s = self.stats
        s.completed_since_iter += 1
        s.prompt_tokens.observe(job.prompt_tokens)
        s.generation_tokens.observe(job.generated)
        longest = max((seq.produced for seq in job.seqs), default=0)
        s.max_generation_tokens.observe(longest)
        if job.max_tokens:
            s.max_tokens_param.observe(job.max_tokens)
        e2e = now - job.arrival
        s.e2e.observe(e2e)
        s.preemptions.observe(0)  # the simulator does not preempt
        s.prefill_kv_computed.observe(job.prompt_tokens)  # and caches no prefix
        decode = now - job.first_token_at if job.first_token_at is not None else 0.0
        s.request_tpot.observe(decode / (longest - 1) if longest > 1 else 0.0)
        if job.scheduled_at is not None:
            s.queue.observe(job.scheduled_at - job.arrival)
            s.inference.observe(now - job.scheduled_at)
            if job.first_token_at is not None:
                s.prefill.observe(job.first_token_at - job.scheduled_at)
                s.decode.observe(now - job.first_token_at)
        reasons = {seq.completion.finish_reason for seq in job.seqs}
        reason = "length" if "length" in reasons else "stop"
        s.success[reason] += 1
        # TensorRT-LLM's MetricsCollector.log_request_metrics_dict: zero values are skipped
        s.trt_success[reason] = s.trt_success.get(reason, 0) + 1
        if e2e > 0:
            s.trt_e2e.observe(e2e)
        if job.first_token_at is not None:
            if job.first_token_at > job.arrival:
                s.trt_ttft.observe(job.first_token_at - job.arrival)
            if longest > 1 and now > job.first_token_at:
                s.trt_tpot.observe((now - job.first_token_at) / (longest - 1))
        if job.scheduled_at is not None and job.scheduled_at > job.arrival:
            s.trt_queue.observe(job.scheduled_at - job.arrival)
