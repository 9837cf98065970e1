"""The serving process: one aiohttp application speaking one flavor's wire format.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``,
``GET /health``, ``GET /version``, ``GET /metrics``. The engine loop
(:class:`simulator.engine.Engine`) and a fault ticker run beside the application.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from aiohttp import web

from simulator.clock import SimClock
from simulator.engine import Engine, Job, Sequence
from simulator.faults import FaultRuntime
from simulator.generate import (
    Completion,
    Departure,
    answer_length,
    choose_departure,
    complete,
    natural_length,
    prompt_state,
)
from simulator.ledger import Ledger
from simulator.metrics import EngineStats, drain_trt, render_trt_prometheus, render_vllm
from simulator.quality import QualityAnswers, completion_of
from simulator.scenario import Scenario
from simulator.wire import (
    MULTIPLE_RESPONSES,
    Framer,
    WireError,
    _Chat,
    _Completion,
    chat_prompt,
    completion_prompts,
    error_body,
    logprobs_asked,
    models_body,
    parse_request,
    vllm_fingerprint,
    vllm_length_error,
    vllm_logprobs_error,
)

FAULT_TICK_S = 0.01
PROM_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""TensorRT-LLM's (prometheus_client as it pins it)."""
VLLM_PROM_CONTENT_TYPE = "text/plain; version=1.0.0; charset=utf-8"
"""vLLM 0.32's (a newer prometheus_client)."""


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


class _Untyped(web.Response):
    """A body without a content type, as Starlette's bare ``Response(content=...)`` sends it
    (aiohttp would add ``application/octet-stream`` while preparing the headers)."""

    async def _prepare_headers(self) -> None:
        await super()._prepare_headers()
        self.headers.pop("Content-Type", None)


def _bare(status: int, body: bytes) -> web.Response:
    return _Untyped(status=status, body=body)


@web.middleware
async def _fastapi_not_found(
    request: web.Request, handler: Callable[[web.Request], Any]
) -> web.StreamResponse:
    """FastAPI's answers for unknown routes and methods: JSON ``{"detail": ...}``."""
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except web.HTTPNotFound:
        return _json({"detail": "Not Found"}, 404)
    except web.HTTPMethodNotAllowed:
        return _json({"detail": "Method Not Allowed"}, 405)


class SimServer:
    def __init__(
        self,
        scenario: Scenario,
        clock: SimClock,
        ledger: Ledger,
        *,
        process_start_wall: float,
        process_start_elapsed: float,
        resume_after: float | None = None,
        restarts: int = 0,
        crash_streak: int = 0,
        on_crash: Callable[[float, float, int], None],
    ) -> None:
        self.scenario = scenario
        self.flavor = scenario.flavor
        self.clock = clock
        self.ledger = ledger
        self.process_start_wall = process_start_wall
        self.rng = random.Random(scenario.seed * 7919 + restarts)
        self.stats = EngineStats(scenario.latency.max_model_len)
        self.faults = FaultRuntime(
            scenario,
            clock,
            ledger,
            process_start=process_start_elapsed,
            resume_after=resume_after,
            on_crash=on_crash,
            inflight=lambda: self.engine.inflight_ids(),
            rng=random.Random(scenario.seed * 104729 + restarts),
            crash_streak=crash_streak,
        )
        self.engine = Engine(scenario, self.faults, self.stats, rng=self.rng)
        self.quality = QualityAnswers(
            scenario.quality, random.Random(scenario.seed * 15485863 + restarts)
        )
        self._seq_no = 0
        self.app = web.Application(client_max_size=64 * 1024 * 1024)
        self.app.router.add_post("/v1/chat/completions", self.chat)
        self.app.router.add_post("/v1/completions", self.completions)
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_get("/health", self.health)
        self.app.router.add_get("/version", self.version)
        self.app.router.add_get("/metrics", self.metrics)
        if scenario.flavor == "trtllm":
            self.app.router.add_get("/health_generate", self.health_generate)
            self.app.router.add_get("/perf_metrics", self.perf_metrics)
            self.app.router.add_post("/v1/responses", self.responses)
            self.app.middlewares.append(_fastapi_not_found)
        if scenario.flavor == "trtllm" and scenario.return_perf_metrics:
            # openai_server.py mounts this only when the LLM args say return_perf_metrics
            self.app.router.add_get("/prometheus/metrics", self.prometheus_metrics)
        self.app.cleanup_ctx.append(self._background)
        if scenario.accelerated:
            self.app.on_response_prepare.append(self._mark_accelerated)

    async def _background(self, app: web.Application) -> AsyncIterator[None]:
        self.faults.tick()
        tasks = [asyncio.create_task(self.engine.run()), asyncio.create_task(self._tick())]
        yield
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(FAULT_TICK_S)
            self.faults.tick()

    async def _mark_accelerated(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers["x-sim-time-scale"] = repr(self.scenario.time_scale)

    # -- plain endpoints -----------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        if self.faults.health_failing():
            if self.flavor == "trtllm":
                msg = "LLM is unavailable. Please check the server logs for more details."
                return web.Response(status=503, text=msg)
            return web.Response(status=503)
        return web.Response(status=200)

    async def health_generate(self, request: web.Request) -> web.Response:
        """TensorRT-LLM's ``/health_generate`` runs a one-token chat: 200 with a plain text
        (no content type, as Starlette's bare ``Response``), 500 when that fails."""
        if self.faults.health_failing() or self.faults.error_for_request("health_generate"):
            return _bare(500, b"Generation health check failed")
        return _bare(200, b"Generation health check OK")

    async def perf_metrics(self, request: web.Request) -> web.Response:
        """Per-request perf metrics: ``[]`` unless ``return_perf_metrics`` (and even then the
        simulator keeps none)."""
        return _json([])

    async def responses(self, request: web.Request) -> web.Response:
        """The Responses API: only for Harmony models (gpt-oss), a 400 otherwise."""
        msg = "Responses API only supports harmony format for now"
        return _json(error_body("trtllm", 400, msg, "BadRequestError"), 400)

    async def version(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = {"version": self.faults.version}
        if self.scenario.accelerated:
            body["sim_time_scale"] = self.scenario.time_scale
        return _json(body)

    async def models(self, request: web.Request) -> web.Response:
        return _json(
            models_body(
                self.flavor,
                self.scenario.model,
                self.scenario.latency.max_model_len,
                int(self.process_start_wall),
            )
        )

    async def metrics(self, request: web.Request) -> web.Response:
        if self.flavor == "trtllm":
            return _json(drain_trt(self.stats))
        text = render_vllm(
            self.stats,
            self.engine.snapshot(),
            model=self.scenario.model,
            process_start=self.process_start_wall,
            multiprocess=self.scenario.multiprocess,
            time_scale=self.scenario.time_scale,
            sim_elapsed=self.clock.elapsed(),
        )
        return web.Response(body=text.encode(), headers={"Content-Type": VLLM_PROM_CONTENT_TYPE})

    async def prometheus_metrics(self, request: web.Request) -> web.Response:
        text = render_trt_prometheus(self.stats, pid=os.getpid())
        return web.Response(body=text.encode(), headers={"Content-Type": PROM_CONTENT_TYPE})

    # -- generation ----------------------------------------------------------------------

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completions")

    async def _generate(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        raw = await request.read()
        try:
            req = parse_request(
                self.flavor,
                endpoint,
                raw,
                self.scenario.model,
                completion_logprobs=self.scenario.completion_logprobs,
            )
        except WireError as exc:
            return _json(exc.body, exc.status)
        trt = self.flavor == "trtllm"
        if trt and req.n > 1 and self.scenario.backend == "pytorch":
            return _json(error_body("trtllm", 400, MULTIPLE_RESPONSES, "BadRequestError"), 400)
        self._seq_no += 1
        framer = Framer(
            self.flavor,
            endpoint,
            # TensorRT-LLM accepts any model name and answers with it
            (req.model or self.scenario.model) if trt else self.scenario.model,
            stream=bool(req.stream),
            seq_no=self._seq_no,
            fingerprint=vllm_fingerprint(self.faults.version, self.scenario.model),
        )
        status = self.faults.error_for_request(framer.id)
        if status is not None:
            msg = "Internal server error (injected by the simulator's error_burst fault)"
            return _json(error_body(self.flavor, status, msg, "InternalServerError"), status)
        logprobs = logprobs_asked(req)
        if isinstance(req, _Chat):
            prompts = [chat_prompt(req.messages)]
        else:
            assert isinstance(req, _Completion)
            prompts = completion_prompts(req.prompt)
        max_len = self.scenario.latency.max_model_len
        budget = req.output_budget
        if self.flavor == "vllm":
            refused = vllm_length_error(req, [n for _, n in prompts], max_len)
            refused = refused or vllm_logprobs_error(req)
            if refused is not None:
                return _json(refused.body, refused.status)
        for _, n_prompt in prompts if self.flavor == "trtllm" else ():
            if n_prompt + (budget or 0) > max_len:
                msg = (
                    f"This model's maximum context length is {max_len} tokens. However, you"
                    f" requested {n_prompt + (budget or 0)} tokens ({n_prompt} in the messages,"
                    f" {budget or 0} in the completion). Please reduce the length of the"
                    " messages or completion."
                )
                return _json(error_body(self.flavor, 400, msg, "BadRequestError"), 400)
        pair_id = request.headers.get("x-shadow-pair-id")
        completions: list[Completion] = []
        for text, n_prompt in prompts:
            for _ in range(req.n):
                # The choice's index in the response (prompt_index * n + i for batches).
                index = len(completions)
                completions.append(
                    self._answer(req, endpoint, text, n_prompt, index, logprobs, framer.id, pair_id)
                )
        prompt_tokens = sum(n for _, n in prompts)
        job = Job(
            id=framer.id,
            seqs=[Sequence(c) for c in completions],
            prompt_tokens=prompt_tokens,
            reserve_tokens=self._kv_reserve(prompts, req.n, budget, completions),
            n=req.n,
            max_tokens=budget if budget is not None else max_len - max(n for _, n in prompts),
        )
        if self.faults.hang_active():
            self.faults.note_hung_request(job.id)
        self.engine.submit(job)
        try:
            if req.stream:
                choice_prompts = [n for _, n in prompts for _ in range(req.n)]
                return await self._stream(
                    request, req, framer, job, prompt_tokens, choice_prompts, logprobs
                )
            while not job.finished:
                await job.event.wait()
                job.event.clear()
            echo = None
            if isinstance(req, _Completion) and req.echo:
                echo = [t for t, _ in prompts for _ in range(req.n)]
            body = framer.response(completions, prompt_tokens, logprobs=logprobs, echo_prefix=echo)
            return _json(body)
        finally:
            if not job.finished:
                self.engine.abort(job)

    def _kv_reserve(
        self,
        prompts: list[tuple[str, int]],
        n: int,
        budget: int | None,
        completions: list[Completion],
    ) -> int:
        policy = self.scenario.latency.kv_reserve
        if policy == "auto":
            policy = "budget" if self.flavor == "trtllm" else "actual"
        prompt_tokens = sum(p for _, p in prompts) * n
        if policy == "actual":
            return prompt_tokens + sum(len(c.tokens) for c in completions)
        max_len = self.scenario.latency.max_model_len
        return sum(
            n * (p + (budget if budget is not None else max(0, max_len - p))) for _, p in prompts
        )

    def _answer(
        self,
        req: _Chat | _Completion,
        endpoint: str,
        prompt: str,
        prompt_tokens: int,
        choice: int,
        logprobs: int | None,
        request_id: str,
        pair_id: str | None,
    ) -> Completion:
        sc = self.scenario
        checked = self.quality.answer(
            {"response_format": req.response_format},
            req.messages if isinstance(req, _Chat) else None,
        )
        if checked is not None:
            # a probe, a JSON answer or a refusal (simulator/quality.py), in the ledger
            self.ledger.write(
                checked.event, request_id=request_id, pair_id=pair_id, **checked.fields
            )
            return completion_of(checked.text, req.output_budget, logprobs)
        start = prompt_state(sc.model, prompt, req.seed)
        natural = natural_length(start, sc.answers.min_tokens, sc.answers.max_tokens)
        max_model_tokens = max(1, sc.latency.max_model_len - prompt_tokens)
        temperature = 1.0 if req.temperature is None else req.temperature
        departure = None
        if temperature == 0.0 and sc.divergence.p_at(0.0) + sc.divergence.p_per_hour > 0.0:
            length, _ = answer_length(
                natural, req.output_budget, req.min_tokens, req.ignore_eos, max_model_tokens
            )
            departure = choose_departure(
                self.rng,
                p=sc.divergence.p_at(self.clock.elapsed()),
                near_tie_share=sc.divergence.near_tie_share,
                length=length,
                position_min=sc.divergence.position_min,
                position_max=sc.divergence.position_max,
            )
        kernels, cut = sc.quality.kernels, sc.quality.truncate
        knob = "divergence"
        if departure is None and temperature == 0.0 and kernels.p > 0.0:
            length, _ = answer_length(
                natural, req.output_budget, req.min_tokens, req.ignore_eos, max_model_tokens
            )
            flip = choose_departure(
                self.rng, p=kernels.p, near_tie_share=1.0 - kernels.hard_share, length=length
            )
            if flip is not None:
                knob = "kernels"
                departure = Departure(
                    flip.position, flip.near_tie, rejoin=kernels.rejoin, max_gap=kernels.max_gap
                )
        max_tokens = req.output_budget
        truncated: tuple[int, int] | None = None
        if cut.p > 0.0 and self.rng.random() < cut.p:
            length, _ = answer_length(
                natural, req.output_budget, req.min_tokens, req.ignore_eos, max_model_tokens
            )
            keep = max(1, round(length * self.rng.uniform(cut.keep_min, cut.keep_max)))
            if keep < length:
                truncated = (keep, length)
                if cut.finish == "length":
                    max_tokens = keep
                else:
                    natural = keep
        rng = None
        if temperature > 0.0:
            seed = f"{req.seed}:{start}:{choice}" if req.seed is not None else self.rng.random()
            rng = random.Random(seed)
        result = complete(
            start,
            natural=natural,
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            ignore_eos=req.ignore_eos,
            max_model_tokens=max_model_tokens,
            stops=req.stops,
            include_stop=req.include_stop_str_in_output,
            top_k=logprobs,
            temperature=temperature,
            rng=rng,
            departure=departure,
        )
        if truncated is not None:
            self.ledger.write(
                "truncation",
                request_id=request_id,
                pair_id=pair_id,
                choice=choice,
                kept=len(result.tokens),
                of=truncated[1],
                finish=result.finish_reason,
            )
        info = result.departure
        if info is not None:
            self.ledger.write(
                "divergence",
                request_id=request_id,
                pair_id=pair_id,
                endpoint=endpoint,
                stream=bool(req.stream),
                choice=choice,
                position=info.position,
                near_tie=info.near_tie,
                reference_token=info.reference_token,
                token=info.token,
                reference_top=list(info.reference_top),
                top=list(info.top),
                visible=result.visible_departure,
                knob=knob,
                model=sc.model,
                seed=req.seed,
                prompt_sha256=hashlib.sha256(prompt.encode()).hexdigest(),
            )
        return result

    async def _stream(
        self,
        request: web.Request,
        req: _Chat | _Completion,
        framer: Framer,
        job: Job,
        prompt_tokens: int,
        choice_prompts: list[int],
        logprobs: int | None,
    ) -> web.StreamResponse:
        headers = {"Content-Type": "text/event-stream; charset=utf-8"}
        resp = web.StreamResponse(headers=headers)
        so = req.stream_options
        include_usage = bool(so is not None and so.include_usage)
        continuous = include_usage and bool(so is not None and so.continuous_usage_stats)
        chat = framer.endpoint == "chat"
        sent_total = 0
        sent = [0] * len(job.seqs)
        offsets = [0] * len(job.seqs)
        try:
            # Like both engines, nothing (not even the headers or the role delta) goes out
            # before the first engine output: the role chunk travels with the first token.
            first = True
            while True:
                await job.event.wait()
                job.event.clear()
                finished = job.finished
                out: list[bytes] = []
                if first:
                    first = False
                    await resp.prepare(request)
                    if chat:
                        usage0 = framer.stream_usage(prompt_tokens, 0) if continuous else None
                        out.extend(framer.role_chunk(i, usage0) for i in range(len(job.seqs)))
                for i, seq in enumerate(job.seqs):
                    if seq.finish_sent:
                        continue
                    upto = seq.produced
                    tokens = seq.completion.tokens[seq.sent : upto]
                    last = upto >= seq.total
                    if not tokens and not last:
                        continue
                    seq.sent = upto
                    sent_total += len(tokens)
                    sent[i] += len(tokens)
                    c = seq.completion
                    usage = None
                    if continuous:
                        # this choice's tokens (vLLM: previous_num_tokens[i]; TensorRT-LLM:
                        # output.length) and prompt
                        usage = framer.stream_usage(choice_prompts[i], sent[i])
                    out.append(
                        framer.token_chunk(
                            i,
                            tokens,
                            finish_reason=c.finish_reason if last else None,
                            stop_reason=c.stop_reason if last else None,
                            logprobs=logprobs,
                            text_offset=offsets[i],
                            usage=usage,
                            usage_follows=include_usage,
                        )
                    )
                    offsets[i] += sum(len(t.text) for t in tokens)
                    seq.finish_sent = last
                if finished:
                    if include_usage:
                        out.append(framer.usage_chunk(framer.usage(prompt_tokens, sent_total)))
                    out.append(Framer.DONE)
                if out:
                    await resp.write(b"".join(out))
                if finished:
                    break
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass  # the client went away; the finally in _generate aborts the job
        return resp
