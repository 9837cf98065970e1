"""Scenario files: what one simulated engine is like and what goes wrong with it.

A scenario is YAML validated by :class:`Scenario`. Shared settings sit at the top level;
``flavors.vllm`` / ``flavors.trtllm`` override them for one flavor (deep merge), so one file can
say "TensorRT-LLM decodes 20% faster". Time units:

- latency parameters are real milliseconds (they are what a client measures);
- everything on the fault timeline (``at_s``, ``every_s``, ``start_s``, ``duration_s``,
  ``restart_delay_s``, rates per hour, MB per hour) is *simulated* seconds/hours since the
  simulator started; with ``time_scale: 60`` one real second is one simulated minute.

Errors::

    ScenarioError       the file is missing, not YAML, or does not validate (says which key)
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

Flavor = Literal["vllm", "trtllm"]
FLAVORS: tuple[Flavor, ...] = ("vllm", "trtllm")


class ScenarioError(ValueError):
    """A scenario that cannot be used, with a sentence saying what to fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Latency(_Strict):
    """The latency model (real milliseconds)."""

    prefill_base_ms: Annotated[float, Field(ge=0)] = 12.0
    prefill_per_token_ms: Annotated[float, Field(ge=0)] = 0.04
    """An iteration that admits requests adds ``prefill_base_ms`` once plus this per prompt
    token of the requests it admits (one batched prefill)."""
    decode_ms: Annotated[float, Field(ge=0)] = 8.0
    """One decode iteration with a single running sequence."""
    batch_slowdown: Annotated[float, Field(ge=0)] = 0.004
    """Fractional slowdown of an iteration per extra running sequence (continuous batching)."""
    noise: Annotated[float, Field(ge=0, le=2)] = 0.05
    """Sigma of the log-normal noise multiplied into every iteration."""
    kv_capacity_tokens: Annotated[int, Field(ge=1)] = 262_144
    """KV cache size in tokens; requests that do not fit queue until others finish."""
    kv_reserve: Literal["auto", "budget", "actual"] = "auto"
    """What a request holds in the KV cache while it runs: ``budget`` = prompt + its output
    budget (``max_tokens``, else up to ``max_model_len``), TensorRT-LLM's GUARANTEED_NO_EVICT;
    ``actual`` = prompt + the tokens it will really generate (vLLM allocates as it goes and
    this simulator does not model preemption); ``auto`` = the flavor's own."""
    kv_block_tokens: Annotated[int, Field(ge=1)] = 16
    max_num_seqs: Annotated[int, Field(ge=1)] = 256
    """Most sequences running at once (vLLM max_num_seqs / TensorRT-LLM max_batch_size)."""
    max_model_len: Annotated[int, Field(ge=16)] = 8192
    warmup_s: Annotated[float, Field(ge=0)] = 0.0
    """For this long (simulated seconds) after each process start, iterations are slower..."""
    warmup_factor: Annotated[float, Field(ge=1)] = 1.0
    """...by this factor (cold caches and graphs after a (re)start)."""


class Answers(_Strict):
    """How long the model's natural answers are (tokens until end-of-sequence)."""

    min_tokens: Annotated[int, Field(ge=1)] = 24
    max_tokens: Annotated[int, Field(ge=1)] = 160

    @model_validator(mode="after")
    def _ordered(self) -> Answers:
        if self.max_tokens < self.min_tokens:
            raise ValueError("answers.max_tokens must be >= answers.min_tokens")
        return self


class Memory(_Strict):
    """Reported memory at process start (MB)."""

    cpu_mb: Annotated[float, Field(ge=0)] = 6_000.0
    gpu_mb: Annotated[float, Field(ge=0)] = 70_000.0


class Divergence(_Strict):
    """The divergence knob: greedy answers that depart from the reference answer."""

    p: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Probability that one greedy choice departs."""
    p_per_hour: Annotated[float, Field(ge=0)] = 0.0
    """Added to ``p`` per simulated hour (outputs that drift over time), capped at 1."""
    near_tie_share: Annotated[float, Field(ge=0, le=1)] = 0.5
    """Share of departures that are near ties (each side's token in the other's top-k)."""
    position_min: Annotated[int, Field(ge=0)] = 0
    position_max: Annotated[int, Field(ge=0)] | None = None
    """Departure position, uniform in [min, max] clipped to the answer; null = answer end."""

    def p_at(self, sim_elapsed_s: float) -> float:
        return min(1.0, self.p + self.p_per_hour * max(0.0, sim_elapsed_s) / 3600.0)


class Kernels(_Strict):
    """``quality.kernels``: the candidate runs other kernels (fusion, precision) on the same
    weights. Greedy answers flip where the model's top two tokens are nearly tied, and the
    answer says the same thing: many divergences, no quality loss."""

    p: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Probability that a greedy answer flips one near tie."""
    max_gap: Annotated[float, Field(gt=0)] = 0.25
    """A flip happens only where the reference's top two logprobs are within this many nats
    (the first such position from a uniform draw on), so it is a near tie by margin."""
    hard_share: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Share of flips that are hard instead: a token outside the reference's top-k."""
    rejoin: bool = True
    """After the flipped token the answer goes on as the reference does (an equivalent
    continuation: same length, same finish); false: it goes on from the flipped prefix."""


class Truncate(_Strict):
    """``quality.truncate``: the candidate cuts answers short (one part of a *worse* engine)."""

    p: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Share of answers cut."""
    keep_min: Annotated[float, Field(gt=0, le=1)] = 0.3
    keep_max: Annotated[float, Field(gt=0, le=1)] = 0.7
    """A cut answer keeps a uniform fraction in [keep_min, keep_max] of its tokens (at least 1)."""
    finish: Literal["length", "stop"] = "length"
    """The finish reason a cut answer reports: ``length`` (as if out of budget) or ``stop``
    (an early end of sequence, seen only as a length shift)."""

    @model_validator(mode="after")
    def _ordered(self) -> Truncate:
        if self.keep_max < self.keep_min:
            raise ValueError("quality.truncate.keep_max must be >= keep_min")
        return self


class Quality(_Strict):
    """Output quality knobs (``quality:``), besides ``divergence``: what a review must tell
    apart, equivalent answers from worse ones (probes answered wrongly, JSON broken, more
    refusals: simulator/quality.py)."""

    kernels: Kernels = Kernels()
    truncate: Truncate = Truncate()
    probe_accuracy: Annotated[float, Field(ge=0, le=1)] = 0.9
    """Probability that a probe (a prompt of ``probe_set``) is answered correctly."""
    broken_json: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Probability that an answer asked to be JSON (a JSON probe, or any request with
    ``response_format`` JSON) is broken (cut in half: not JSON)."""
    json_answers: bool = False
    """Answer every request that asks for JSON (``response_format``) with valid JSON (an
    instance of its schema, else ``{"answer": ...}``), broken at ``broken_json``; false: only
    JSON probes, and other requests get the ordinary text (as before these knobs)."""
    refusal: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Probability that any other answer is a refusal sentence instead."""
    probe_set: str | None = None
    """The probe set the simulator recognises (a JSONL path); null = the shipped one."""


class _Schedule(_Strict):
    """When a fault happens: exactly one of ``at_s``, ``every_s`` or ``rate_per_hour``."""

    at_s: list[Annotated[float, Field(ge=0)]] | None = None
    every_s: Annotated[float, Field(gt=0)] | None = None
    rate_per_hour: Annotated[float, Field(gt=0)] | None = None
    start_s: Annotated[float, Field(ge=0)] = 0.0
    """First occurrence of ``every_s``; start of the ``rate_per_hour`` Poisson process."""
    until_s: Annotated[float, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _one_schedule(self) -> _Schedule:
        given = [k for k in ("at_s", "every_s", "rate_per_hour") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of at_s (list of times), every_s (period) or rate_per_hour"
                f" (Poisson); got {given or 'none'}"
            )
        return self

    def occurrences(self, seed: int) -> Iterator[float]:
        """Simulated seconds of each occurrence, ascending, deterministic for one seed."""
        if self.at_s is not None:
            times: Iterator[float] = iter(sorted(self.at_s))
        elif self.every_s is not None:
            times = (self.start_s + k * self.every_s for k in _count())
        else:
            assert self.rate_per_hour is not None
            times = _poisson(random.Random(seed), self.start_s, self.rate_per_hour / 3600.0)
        for t in times:
            if self.until_s is not None and t > self.until_s:
                return
            yield t


def _count() -> Iterator[int]:
    k = 0
    while True:
        yield k
        k += 1


def _poisson(rng: random.Random, start: float, rate_per_s: float) -> Iterator[float]:
    t = start
    while True:
        t += rng.expovariate(rate_per_s)
        yield t


class CrashFault(_Schedule):
    """The serving process exits; the supervisor restarts it after ``restart_delay_s``."""

    kind: Literal["crash"]
    restart_delay_s: Annotated[float, Field(ge=0)] = 30.0
    backoff: bool = False
    """Kubernetes' CrashLoopBackOff: the delay doubles with each crash that comes within
    :data:`BACKOFF_RESET_S` of the process start, up to ``backoff_max_s``."""
    backoff_max_s: Annotated[float, Field(ge=0)] = 300.0


BACKOFF_RESET_S = 600.0
"""A process that ran this long (simulated seconds) before crashing resets the backoff."""


class HangFault(_Schedule):
    """The engine stops stepping: streams stop mid-way, new requests wait, for a while."""

    kind: Literal["hang"]
    duration_s: Annotated[float, Field(gt=0)] = 60.0


class ErrorBurstFault(_Schedule):
    """Requests arriving in the window get an HTTP 5xx."""

    kind: Literal["error_burst"]
    duration_s: Annotated[float, Field(gt=0)] = 30.0
    status: Annotated[int, Field(ge=500, le=599)] = 500
    share: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Share of the requests in the window that fail."""
    health_fails: bool = False
    """``/health`` answers 503 during the window too (an engine dead behind a live server)."""


class VersionChangeFault(_Schedule):
    """The engine reports a new version from then on (optionally restarting to get it)."""

    kind: Literal["version_change"]
    to_version: str
    restart: bool = False
    restart_delay_s: Annotated[float, Field(ge=0)] = 30.0


class LeakFault(_Strict):
    """Reported memory grows at a steady rate (per simulated hour) from ``start_s``."""

    kind: Literal["leak"]
    start_s: Annotated[float, Field(ge=0)] = 0.0
    mb_per_hour: Annotated[float, Field(gt=0)]
    target: Literal["auto", "cpu", "gpu"] = "auto"
    """Which memory grows; auto = the one the flavor reports (vLLM: cpu RSS; TRT-LLM: gpu)."""


class DriftFault(_Strict):
    """Decode time grows over time: +``growth_per_hour`` of itself per simulated hour."""

    kind: Literal["drift"]
    start_s: Annotated[float, Field(ge=0)] = 0.0
    growth_per_hour: Annotated[float, Field(gt=0)]

    def multiplier(self, sim_elapsed_s: float) -> float:
        return 1.0 + self.growth_per_hour * max(0.0, sim_elapsed_s - self.start_s) / 3600.0


Fault = Annotated[
    CrashFault | HangFault | ErrorBurstFault | VersionChangeFault | LeakFault | DriftFault,
    Field(discriminator="kind"),
]
_FAULT_MODELS: dict[str, type[BaseModel]] = {
    "crash": CrashFault,
    "hang": HangFault,
    "error_burst": ErrorBurstFault,
    "version_change": VersionChangeFault,
    "leak": LeakFault,
    "drift": DriftFault,
}


COMPLETION_LOGPROBS_DEFAULT = True


class Scenario(_Strict):
    """One simulated engine, resolved for one flavor."""

    name: str = "unnamed"
    description: str = ""
    flavor: Flavor = "vllm"
    model: str = "sim-llama-3-8b-instruct"
    version: str = ""
    """Reported by /version; empty = the flavor's default."""
    seed: int = 0
    time_scale: Annotated[float, Field(gt=0)] = 1.0
    """Simulated seconds per real second (1 = real time). Reported wherever time is."""
    multiprocess: bool = False
    """vLLM only: Prometheus multiprocess mode, in which the ``process_*`` metrics vanish."""
    return_perf_metrics: bool = False
    """TensorRT-LLM only: the LLM arg of that name, which mounts ``/prometheus/metrics``
    (``trtllm_*`` metrics); without it that path is a 404, as on the real server."""
    backend: Literal["pytorch", "tensorrt"] = "pytorch"
    """TensorRT-LLM only: trtllm-serve's ``--backend``. The PyTorch one (the default) refuses
    ``n > 1`` (400 "Multiple response is not supported in PyTorch workflow")."""
    completion_logprobs: bool = COMPLETION_LOGPROBS_DEFAULT
    """TensorRT-LLM only: accept ``logprobs`` on ``/v1/completions``. TensorRT-LLM 1.2.0rc2
    refuses it (400 "logprobs is not supported"): ``false`` answers so. True by default
    because the mirror asks the candidate for them (a known issue of the mirror with real
    TensorRT-LLM); see simulator/README.md."""
    latency: Latency = Latency()
    answers: Answers = Answers()
    memory: Memory = Memory()
    divergence: Divergence = Divergence()
    faults: list[Fault] = Field(default_factory=list)
    quality: Quality = Quality()

    @property
    def accelerated(self) -> bool:
        return self.time_scale != 1.0

    @property
    def reported_version(self) -> str:
        return self.version or DEFAULT_VERSION[self.flavor]


DEFAULT_VERSION: dict[str, str] = {"vllm": "0.32.0", "trtllm": "1.2.0rc2"}

_TOP_KEYS = (set(Scenario.model_fields) - {"flavor"}) | {"flavors"}
"""The flavor comes from the command line, never from the file."""


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _allowed_at(loc: tuple[int | str, ...]) -> list[str]:
    """The keys allowed in the mapping that holds ``loc`` (for "extra key" errors)."""
    model: Any = Scenario
    for part in loc[:-1]:
        if part in _FAULT_MODELS:
            model = _FAULT_MODELS[str(part)]
            continue
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(part)
        annotation = getattr(field, "annotation", None)
        model = (
            annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel)
            else None
        )
    if model is None:
        return []
    return sorted(k for k in model.model_fields if k != "flavor")


def _explain(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors()[:8]:
        loc = ".".join(str(p) for p in err["loc"]) or "<top>"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = f"unknown key; allowed here: {_allowed_at(tuple(err['loc']))}"
        lines.append(f"  {loc}: {msg}")
    more = exc.error_count() - len(lines)
    tail = f"\n  ... and {more} more" if more > 0 else ""
    return f"scenario {source} is invalid:\n" + "\n".join(lines) + tail


def resolve(raw: dict[str, Any], flavor: Flavor, source: str = "<dict>") -> Scenario:
    """Validate a scenario mapping for one flavor, with its ``flavors.<flavor>`` overrides."""
    if not isinstance(raw, dict):
        raise ScenarioError(
            f"scenario {source} must be a mapping of keys, got {type(raw).__name__}"
        )
    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise ScenarioError(
            f"scenario {source}: unknown key(s) {unknown}; allowed: {sorted(_TOP_KEYS)}"
        )
    flavors = raw.get("flavors") or {}
    if not isinstance(flavors, dict) or set(flavors) - set(FLAVORS):
        raise ScenarioError(
            f"scenario {source}: 'flavors' must map some of {list(FLAVORS)} to overrides,"
            f" got {flavors!r}"
        )
    merged = {k: v for k, v in raw.items() if k != "flavors"}
    merged = _deep_merge(merged, flavors.get(flavor) or {})
    merged["flavor"] = flavor
    try:
        return Scenario.model_validate(merged)
    except ValidationError as exc:
        raise ScenarioError(_explain(exc, source)) from exc


def shipped() -> list[str]:
    """Names of the scenarios shipped with the package."""
    folder = resources.files("simulator") / "scenarios"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def read_raw(spec: str | Path) -> tuple[dict[str, Any], str]:
    """Read a scenario by path, or by the name of a shipped one (``clean``, ``leaky``, ...)."""
    path = Path(spec)
    if path.is_file():
        text, source = path.read_text(), str(path)
    else:
        candidate = resources.files("simulator") / "scenarios" / f"{spec}.yaml"
        if not candidate.is_file():
            raise ScenarioError(
                f"no scenario file {spec!r}: give a path to a YAML file or one of the shipped"
                f" names {shipped()}"
            )
        text, source = candidate.read_text(), f"shipped:{spec}"
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ScenarioError(f"scenario {source} is not valid YAML: {exc}") from exc
    return raw, source


def load_scenario(spec: str | Path | None, flavor: Flavor, **overrides: Any) -> Scenario:
    """Load, merge ``overrides`` (top-level keys, deep-merged) and validate for ``flavor``."""
    raw, source = ({}, "<defaults>") if spec is None else read_raw(spec)
    if overrides:
        raw = _deep_merge(raw, overrides)
    return resolve(raw, flavor, source)
