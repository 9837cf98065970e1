"""``shadow-ab demo``: a whole shadow deployment on simulators, then its review.

::

    shadow-ab demo [--duration 180] [--scenario fast-crashy] [--incumbent-scenario noisy]
                   [--time-scale 600] [--deployment NAME] [-o PATH] [--policy P]
                   [--database-url URL] [--kafka [HOST:PORT]] [--engines sim|vllm-cpu]

On the embedded defaults (the SQLite store under the state dir, the mirror's direct sink) it

1. starts a vLLM-flavor simulator as the incumbent (scenario ``noisy``: clean latencies, a 1 %
   near-tie noise floor) and a TensorRT-LLM-flavor simulator as the candidate (``--scenario``,
   default ``fast-crashy``: 20 % faster decode, crashes about twice a simulated day) -- both are
   ``shadow-ab sim`` (simulator/README.md), with simulated time running ``--time-scale`` times
   faster so the fault schedule of many hours fits in a few minutes (latencies stay real);
2. starts ``shadow-ab mirror`` in front of them (every request shadowed, 20 % replayed to the
   incumbent for the noise floor, the health sampler scraping both engines every second, and
   labelled probes to both engines at ``DEMO_PROBES_PER_MINUTE``: a demo compresses a month
   into minutes, so it sends them far faster than the mirror's default of one a minute);
3. sends the traffic generator's realistic mix (shared system prompts, short and long prompts,
   chat and completions, streaming or not, greedy and seeded sampling, JSON asks) through the
   mirror at concurrency levels that change every phase, printing progress;
4. stops the mirror (its records flushed), builds the review over the run with the policy
   (``min_days`` waived: a demo lasts minutes) and writes the HTML report;
5. prints the verdict and the report's path.

``--database-url`` puts the store elsewhere (PostgreSQL); ``--kafka`` sends the records through
Kafka (per-run topics) and runs ``shadow-ab ingest`` as a subprocess into the store. The
deployment row and the report say the engines are simulators: nothing generated is presented
as measured.

``--engines vllm-cpu`` runs it on two real vLLMs instead (the CPU build, after ``shadow-ab
engine vllm prepare``; a clear error says so when it has not been run): the incumbent in bf16,
the candidate in fp32, the same tiny random model, each engine's threads on its own CPU, a
traffic mix sized for the tiny model, concurrency phases 1, 2, 4, 2. The deployment row and a
note at the top of the report say what they were: divergence figures are about numerics (bf16
against fp32), not language; latency figures are about plumbing (a tiny model answers at
once). No fault is injected: incidents are whatever the real engines do.

Exit status: 0 the demo ran and the report was written (whatever the verdict); 1 something
failed to start or the run recorded nothing (the message says what).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import orjson
from sqlalchemy import Engine, func, insert, select, update

from shadow_ab.settings import services_env_file, state_dir

if TYPE_CHECKING:
    from shadow_ab.dev.processes import ManagedProcess

DEFAULT_SCENARIO = "fast-crashy"
DEFAULT_INCUMBENT_SCENARIO = "noisy"
DEFAULT_TIME_SCALE = 600.0
CONCURRENCY_PHASES = (2, 8, 24, 8, 4, 16)
HEALTH_INTERVAL_S = 1.0
REPLAY_RATE = 0.2
DEMO_PROBES_PER_MINUTE = 120.0
"""Probe pairs a minute in a simulator demo: ~360 in the default 3 minutes, past the default
policy's 200 (a real mirror's default is 1 a minute, mirror/probes.py)."""
REAL_PROBES_PER_MINUTE = 12.0
"""On two real vLLMs sharing two CPUs: fewer (a tiny random model answers probes wrongly
anyway; they show the plumbing)."""
MIRROR_STARTUP_S = 90.0
SIMULATED_HARDWARE = "simulated: shadow-ab sim on CPU, no GPU (not a measurement of real engines)"
MIN_DAYS_NOTE = (
    "Demo: the policy's minimum days was waived and its plan is one look (a demo lasts minutes;"
    " the simulators compress"
    " their fault schedule by the time scale, while every timestamp in the store is wall-clock)."
)


class DemoError(RuntimeError):
    """The demo could not run; the message says what failed."""


@dataclass
class DemoResult:
    deployment: str
    database_url: str
    report_path: Path
    decision: str
    reason: str
    report_id: int | None
    requests: int


def _say(text: str) -> None:
    click.echo(text, err=True)


def _clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def compressed_incident_config(time_scale: float) -> Any:
    """Incident detection with its leak windows in simulated time: the simulators compress the
    fault schedule (a leak of X MB per simulated hour grows X * time_scale MB per real hour), so
    the leak's stretches and warm-up shrink by the time scale; crash and burst settings stay in real
    seconds (an engine process still takes real seconds to restart)."""
    from evaluator.incidents import IncidentConfig

    base = IncidentConfig()
    ts = max(1.0, time_scale)
    sustain_h = max(base.leak_sustain_h / ts, 30 * HEALTH_INTERVAL_S / 3600)
    return replace(
        base,
        leak_sustain_h=sustain_h,
        leak_max_span_h=max(base.leak_max_span_h / ts, 4 * sustain_h),
        leak_step_min=max(base.leak_step_min / ts, 5 * HEALTH_INTERVAL_S / 60),
        leak_warmup_min=base.leak_warmup_min / ts,
        leak_bin_s=max(base.leak_bin_s / ts, HEALTH_INTERVAL_S),
        leak_threshold_mb_h=base.leak_threshold_mb_h * ts,
    )


def _kafka_bootstrap(value: str) -> str:
    """``--kafka`` alone: the environment's or the local services' bootstrap."""
    if value not in ("", "env"):
        return value
    found = os.environ.get("SHADOW_AB_KAFKA_BOOTSTRAP")
    if not found and services_env_file().exists():
        for line in services_env_file().read_text().splitlines():
            key, _, val = line.partition("=")
            if key == "SHADOW_AB_KAFKA_BOOTSTRAP":
                found = val
    if not found:
        raise DemoError(
            "--kafka needs a broker: give --kafka HOST:PORT, set SHADOW_AB_KAFKA_BOOTSTRAP, or run"
            " `shadow-ab services up` for the local one"
        )
    return found


def _engine_version(base_url: str) -> str:
    from shadow_ab.dev.processes import http_get

    status, body = http_get(base_url + "/version", timeout=5.0)
    if status != 200:
        return "unknown"
    try:
        return str(orjson.loads(body).get("version", "unknown"))
    except orjson.JSONDecodeError:
        return "unknown"


def record_deployment(
    engine: Engine,
    name: str,
    *,
    incumbent: dict[str, str],
    candidate: dict[str, str],
    model: str,
    policy: dict[str, Any],
    started_at: datetime,
    ended_at: datetime | None = None,
    hardware: str = SIMULATED_HARDWARE,
) -> None:
    """Create or fill in the deployment's row (the writers may have made a bare one)."""
    from storage.models import Deployment

    values = {
        "incumbent_engine": incumbent["engine"],
        "incumbent_version": incumbent["version"],
        "candidate_engine": candidate["engine"],
        "candidate_version": candidate["version"],
        "model": model,
        "hardware": hardware,
        "started_at": started_at,
        "ended_at": ended_at,
        "policy": policy,
    }
    with engine.begin() as conn:
        exists = conn.execute(select(Deployment.name).where(Deployment.name == name)).first()
        if exists:
            conn.execute(update(Deployment).where(Deployment.name == name).values(**values))
        else:
            conn.execute(insert(Deployment).values(name=name, **values))


def _count_exchanges(engine: Engine, deployment: str) -> int:
    from storage.models import Exchange

    with engine.connect() as conn:
        stmt = select(func.count()).select_from(Exchange).where(Exchange.deployment == deployment)
        return int(conn.execute(stmt).scalar_one())


@contextlib.contextmanager
def _ingester(
    bootstrap: str, database_url: str, topics: dict[str, str], group: str, workdir: Path
) -> Iterator[ManagedProcess]:
    """``shadow-ab ingest`` as a subprocess on the run's topics, stopped (SIGTERM) at exit."""
    from shadow_ab.dev.processes import ManagedProcess, ProcessError

    env = {**os.environ, "SHADOW_AB_INGEST_KAFKA_CONSUMER": '{"auto.offset.reset": "earliest"}'}
    cmd = [
        sys.executable,
        "-m",
        "shadow_ab",
        "ingest",
        "--kafka",
        bootstrap,
        "--database-url",
        database_url,
        "--group",
        group,
        "--exchanges-topic",
        topics["exchanges"],
        "--health-topic",
        topics["health"],
        "--dlq-topic",
        topics["dlq"],
        "--metrics-port",
        "0",
    ]
    proc = ManagedProcess(cmd, workdir / "ingest.log", env=env)
    try:
        time.sleep(0.5)
        if proc.process.poll() is not None:
            raise DemoError(
                f"shadow-ab ingest exited with {proc.process.returncode}: {proc.stderr()[-2000:]}"
            )
        yield proc
    finally:
        with contextlib.suppress(ProcessError):  # killed after 60 s: nothing more to do
            proc.stop(60.0)


def _wait_ingested(engine: Engine, deployment: str, timeout_s: float = 120.0) -> int:
    """Wait until the ingester has written everything (the row count stops growing)."""
    deadline = time.monotonic() + timeout_s
    last, stable_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        n = _count_exchanges(engine, deployment)
        if n != last:
            last, stable_since = n, time.monotonic()
        elif n > 0 and time.monotonic() - stable_since > 5.0:
            return n
        time.sleep(0.5)
    return last


async def _drive(
    base_url: str,
    duration_s: float,
    phases: tuple[int, ...],
    seed: int,
    report: Callable[[float, int, Any], None],
    mix: Any = None,
) -> int:
    from shadow_ab.dev.traffic import (
        RequestGenerator,
        TrafficMix,
        make_plan,
        make_session,
        run_traffic,
    )

    generator = RequestGenerator(
        mix or TrafficMix(), seed
    )  # one generator: sessions span the phases
    phase_s = duration_s / len(phases)
    total = 0
    started = time.monotonic()
    async with make_session() as session:
        for i, concurrency in enumerate(phases):
            remaining = duration_s - (time.monotonic() - started)
            if remaining <= 0.5:
                break
            plan = make_plan(
                concurrency=concurrency,
                duration_s=min(phase_s, remaining),
                seed=seed + i,
                timeout_s=60.0,
            )
            result = await run_traffic(session, base_url, generator, plan)
            total += len(result.rows)
            report(time.monotonic() - started, concurrency, result)
    return total


ENGINE_CHOICES = ("sim", "vllm-cpu")
REAL_PHASES = (1, 2, 4, 2)
"""Concurrency phases on real vLLM: two engines on a CPU each, so fewer clients at once."""


@dataclass
class DemoEngines:
    """The two engines a demo runs on, and what the run and its report say about them."""

    incumbent_url: str
    candidate_url: str
    incumbent: dict[str, str]
    candidate: dict[str, str]
    model: str
    hardware: str
    mirror: dict[str, Any]
    """Mirror settings for these engines (engine ids, flavors)."""
    phases: tuple[int, ...]
    mix: Any = None
    """The traffic mix (``shadow_ab.dev.traffic.TrafficMix``); None: the default one."""
    notes: tuple[str, ...] = ()
    """Notes at the top of the report."""
    time_scale: float = 1.0
    probes_per_minute: float = DEMO_PROBES_PER_MINUTE


@contextlib.contextmanager
def _engines(
    kind: str,
    scenario: str,
    incumbent_scenario: str,
    time_scale: float,
    duration_s: float,
    workdir: Path,
    running: tuple[str, str] | None = None,
) -> Iterator[DemoEngines]:
    if kind == "vllm-cpu":
        with _real_vllm(workdir, running) as pair:
            yield pair
    elif kind == "sim":
        with _simulators(scenario, incumbent_scenario, time_scale, duration_s, workdir) as pair:
            yield pair
    else:
        raise DemoError(f"--engines {kind!r}: one of {', '.join(ENGINE_CHOICES)}")


@contextlib.contextmanager
def _simulators(
    scenario: str, incumbent_scenario: str, time_scale: float, duration_s: float, workdir: Path
) -> Iterator[DemoEngines]:
    from shadow_ab.dev.processes import running_sim

    _say(
        "shadow-ab demo: the engines are SIMULATORS (shadow-ab sim), not vLLM or TensorRT-LLM;"
        " every figure in this run is generated by them."
    )
    with (
        running_sim(
            "vllm",
            incumbent_scenario,
            time_scale=time_scale,
            ledger=workdir / "incumbent-ledger.jsonl",
        ) as inc,
        running_sim(
            "trtllm", scenario, time_scale=time_scale, ledger=workdir / "candidate-ledger.jsonl"
        ) as cand,
    ):
        _say(f"  incumbent  vLLM-flavor simulator ({incumbent_scenario}) at {inc.base_url}")
        _say(f"  candidate  TensorRT-LLM-flavor simulator ({scenario}) at {cand.base_url}")
        _say(
            f"  time       simulated time runs {time_scale:g}x: {_clock(duration_s)} here is"
            f" {duration_s * time_scale / 3600:.1f} simulated hours of faults; latencies are"
            " real-time"
        )
        yield DemoEngines(
            incumbent_url=inc.base_url,
            candidate_url=cand.base_url,
            incumbent={
                "engine": f"vllm (simulator, scenario {incumbent_scenario})",
                "version": _engine_version(inc.base_url),
            },
            candidate={
                "engine": f"tensorrt-llm (simulator, scenario {scenario})",
                "version": _engine_version(cand.base_url),
            },
            model="sim-llama-3-8b-instruct",
            hardware=SIMULATED_HARDWARE,
            mirror={
                "incumbent": {"engine": "vllm@incumbent"},
                "candidate": {"engine": "trtllm@candidate"},
            },
            phases=CONCURRENCY_PHASES,
            time_scale=time_scale,
        )


def real_engines_note(version: str, cpu: str) -> str:
    """The report's note on a demo run on real vLLM (bf16 incumbent, fp32 candidate)."""
    return (
        f"The engines of this deployment were real vLLM {version} (the CPU build, vllm-cpu) on"
        f" this machine's CPU ({cpu}): the incumbent in bfloat16, the candidate in float32, both"
        " serving the same tiny Llama with random weights and a tokenizer trained locally. So the"
        " divergence figures measure numerics (how often bf16 and fp32 pick a different greedy"
        " token), not language quality, and the latency figures measure the plumbing (a tiny"
        " model answers almost at once), not how fast vLLM serves a real model."
    )


def real_demo_mix() -> Any:
    """The realistic mix, sized for the tiny model (1024 tokens of context) and its tokenizer:
    shorter long prompts and answers, fewer turns, no JSON asks (a random model cannot follow
    them), mostly greedy (greedy pairs are the ones divergence judges)."""
    from shadow_ab.dev.engines.vllm_cpu import SERVED_MODEL
    from shadow_ab.dev.traffic import make_mix

    return make_mix(
        model=SERVED_MODEL,
        greedy_share=0.7,
        json_share=0.0,
        long_prompt_share=0.1,
        long_prompt_words=(80, 200),
        max_tokens=(16, 32, 64),
        max_turns=3,
    )


@contextlib.contextmanager
def _real_vllm(workdir: Path, running: tuple[str, str] | None = None) -> Iterator[DemoEngines]:
    """Two real vLLMs started here, one CPU each (or, with ``running``, the base URLs of a bf16
    and an fp32 engine already running: the real-engine tests use theirs)."""
    from shadow_ab.dev.engines import vllm_cpu

    try:
        cpu = vllm_cpu.check_machine()
    except vllm_cpu.EngineUnavailable as exc:
        raise DemoError(f"--engines vllm-cpu: {exc}") from exc
    lay = vllm_cpu.layout()
    if running is None and not vllm_cpu.venv_ready(lay):
        raise DemoError(
            f"--engines vllm-cpu: real vLLM is not prepared (no complete venv at {lay.venv}):"
            " run `shadow-ab engine vllm prepare` first (once: about 7 minutes and 6.3 GB under"
            " the state folder), or run the demo on simulators (without --engines)"
        )
    inc_cpus, cand_cpus = vllm_cpu.own_cpus()
    kernels = f"{os.cpu_count()} CPUs, {cpu.kernels} kernels, one CPU per engine"
    _say(
        "shadow-ab demo: the engines are REAL vLLM (vllm-cpu, the CPU build) serving a tiny"
        " random model built here: bf16 incumbent, fp32 candidate. Divergence is about numerics,"
        " latency about plumbing."
    )

    def pair(inc_url: str, cand_url: str) -> DemoEngines:
        version = _engine_version(inc_url)
        _say(f"  incumbent  real vLLM {version}, bfloat16, CPU {inc_cpus}, at {inc_url}")
        _say(f"  candidate  real vLLM {version}, float32, CPU {cand_cpus}, at {cand_url}")
        return DemoEngines(
            incumbent_url=inc_url,
            candidate_url=cand_url,
            incumbent={"engine": "vllm (real, CPU build, bfloat16)", "version": version},
            candidate={"engine": "vllm (real, CPU build, float32)", "version": version},
            model=f"{vllm_cpu.SERVED_MODEL} (random weights, built locally)",
            hardware=f"real vLLM on CPU ({cpu.machine}, {kernels})",
            mirror={
                "incumbent": {"engine": "vllm-bf16@incumbent", "flavor": "vllm"},
                "candidate": {"engine": "vllm-fp32@candidate", "flavor": "vllm"},
            },
            phases=REAL_PHASES,
            mix=real_demo_mix(),
            notes=(real_engines_note(version, kernels),),
            probes_per_minute=REAL_PROBES_PER_MINUTE,
        )

    if running is not None:
        yield pair(*running)
        return
    _say(f"  starting both engines (CPU {inc_cpus} and CPU {cand_cpus}; 1-4 minutes) ...")
    specs = [
        vllm_cpu.EngineSpec("bfloat16", inc_cpus, f"demo-bf16-{os.getpid()}"),
        vllm_cpu.EngineSpec("float32", cand_cpus, f"demo-fp32-{os.getpid()}"),
    ]
    started = time.monotonic()
    try:
        engines = vllm_cpu.start_vllms(specs)
    except vllm_cpu.EngineStartError as exc:
        raise DemoError(f"real vLLM did not start: {exc}") from exc
    try:
        _say(f"  both engines healthy in {time.monotonic() - started:.0f}s")
        yield pair(engines[0].base_url, engines[1].base_url)
    finally:
        for engine in engines:
            engine.stop()


def run_demo(
    *,
    duration_s: float = 180.0,
    scenario: str = DEFAULT_SCENARIO,
    incumbent_scenario: str = DEFAULT_INCUMBENT_SCENARIO,
    time_scale: float = DEFAULT_TIME_SCALE,
    deployment: str | None = None,
    output: Path | None = None,
    policy_path: str | None = None,
    database_url: str | None = None,
    kafka: str | None = None,
    phases: tuple[int, ...] | None = None,
    seed: int = 0,
    progress: bool = True,
    engines: str = "sim",
    running_engines: tuple[str, str] | None = None,
) -> DemoResult:
    """Run the demo (see the module docstring); the verdict and where the report went.

    ``engines``: ``sim`` (simulators) or ``vllm-cpu`` (real vLLM, bf16 incumbent and fp32
    candidate); with ``vllm-cpu``, ``running_engines`` gives the base URLs of a bf16 and an fp32
    engine already running, used instead of starting two."""
    from evaluator.divergence import DivergenceConfig
    from evaluator.policy import load_policy
    from evaluator.review import build_review, default_analyses, resolve_window
    from shadow_ab.cli_support import resolve_url
    from shadow_ab.dev.processes import running_mirror
    from storage.db import make_engine, redact_url
    from storage.migrate import upgrade

    name = deployment or f"demo-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    url = resolve_url(database_url)
    bootstrap = _kafka_bootstrap(kafka) if kafka is not None else None
    workdir = state_dir() / "demo" / name
    workdir.mkdir(parents=True, exist_ok=True)
    report_path = output or workdir / "report.html"
    policy = load_policy(policy_path).with_minimums(
        min_days=0.0, horizon_days=1.0, note=MIN_DAYS_NOTE
    )
    upgrade(url)
    engine = make_engine(url)
    started_at = datetime.now(UTC)
    try:
        with _engines(
            engines, scenario, incumbent_scenario, time_scale, duration_s, workdir, running_engines
        ) as pair:
            record_deployment(
                engine,
                name,
                incumbent=pair.incumbent,
                candidate=pair.candidate,
                model=pair.model,
                policy=policy.to_dict(),
                started_at=started_at,
                hardware=pair.hardware,
            )
            mirror_kw: dict[str, Any] = {
                "deployment": name,
                "shadow": {"rate": 1.0, "replay_rate": REPLAY_RATE},
                "health": {"interval_s": HEALTH_INTERVAL_S},
                "probes": {"per_minute": pair.probes_per_minute},
                **pair.mirror,
            }
            topics = {k: f"shadow.demo.{name}.{k}" for k in ("exchanges", "health", "dlq")}
            with contextlib.ExitStack() as stack:
                if bootstrap:
                    from shadow_ab.topics import default_topics, delete_topics, ensure_topics

                    ensure_topics(
                        bootstrap,
                        default_topics(topics["exchanges"], topics["health"], topics["dlq"]),
                    )
                    stack.callback(delete_topics, bootstrap, list(topics.values()))
                    env = {
                        "SHADOW_AB_MIRROR_KAFKA__BOOTSTRAP": bootstrap,
                        "SHADOW_AB_MIRROR_KAFKA__TOPIC_EXCHANGES": topics["exchanges"],
                        "SHADOW_AB_MIRROR_KAFKA__TOPIC_HEALTH": topics["health"],
                    }
                    stack.enter_context(
                        _ingester(bootstrap, url, topics, f"shadow-ab-demo-{name}", workdir)
                    )
                    mirror = stack.enter_context(
                        running_mirror(
                            pair.incumbent_url,
                            pair.candidate_url,
                            kafka=bootstrap,
                            env=env,
                            startup_timeout=MIRROR_STARTUP_S,
                            **mirror_kw,
                        )
                    )
                    sink = f"Kafka {bootstrap} (topics {topics['exchanges']}, {topics['health']})"
                    sink += f" -> shadow-ab ingest -> {redact_url(url)}"
                else:
                    mirror = stack.enter_context(
                        running_mirror(
                            pair.incumbent_url,
                            pair.candidate_url,
                            database_url=url,
                            startup_timeout=MIRROR_STARTUP_S,
                            **mirror_kw,
                        )
                    )
                    sink = f"direct sink -> {redact_url(url)}"
                _say(
                    f"  mirror     {mirror.base_url} (all requests shadowed, {REPLAY_RATE:.0%}"
                    f" replayed, {pair.probes_per_minute:g} probe pairs a minute to both"
                    f" engines), records: {sink}"
                )

                def report(elapsed: float, concurrency: int, result: Any) -> None:
                    if not progress:
                        return
                    ok = result.ok_rows
                    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
                    ttft.sort()
                    p50 = f"{ttft[len(ttft) // 2] * 1000:.0f} ms" if ttft else "-"
                    _say(
                        f"  [{_clock(elapsed)} / {_clock(duration_s)}]"
                        f" concurrency {concurrency:>2}:"
                        f" {len(result.rows):>4} requests, {len(result.errors)} errors,"
                        f" client TTFT p50 {p50}"
                    )

                requests = asyncio.run(
                    _drive(mirror.v1, duration_s, phases or pair.phases, seed, report, pair.mix)
                )
                mirror.stop()
                if bootstrap:
                    _say("  waiting for the ingester to write the last records ...")
                    _wait_ingested(engine, name)
        ended_at = datetime.now(UTC)
        record_deployment(
            engine,
            name,
            incumbent=pair.incumbent,
            candidate=pair.candidate,
            model=pair.model,
            policy=policy.to_dict(),
            started_at=started_at,
            ended_at=ended_at,
            hardware=pair.hardware,
        )
        stored = _count_exchanges(engine, name)
        if stored == 0:
            raise DemoError(
                f"the run recorded no exchanges in {redact_url(url)}: see the mirror's log"
            )
        _say(f"  {requests} client requests, {stored} exchanges stored; reviewing ...")
        window = resolve_window(engine, name)
        analyses = default_analyses(
            incident_config=compressed_incident_config(pair.time_scale),
            divergence_config=DivergenceConfig(max_pairs_per_day=20_000, max_pairs=20_000),
        )
        review = build_review(engine, name, window, policy, analyses=analyses, notes=pair.notes)
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(review.html or "")
        return DemoResult(
            deployment=name,
            database_url=redact_url(url),
            report_path=report_path,
            decision=review.decision,
            reason=review.verdict.reason,
            report_id=review.report_id,
            requests=requests,
        )
    finally:
        engine.dispose()


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--duration",
    "duration_s",
    type=click.FloatRange(min=5),
    default=180.0,
    show_default=True,
    help="Seconds of traffic.",
)
@click.option(
    "--scenario",
    default=DEFAULT_SCENARIO,
    show_default=True,
    help="The candidate simulator's scenario (simulator/scenarios/ name or YAML path).",
)
@click.option(
    "--incumbent-scenario",
    default=DEFAULT_INCUMBENT_SCENARIO,
    show_default=True,
    help="The incumbent simulator's scenario.",
)
@click.option(
    "--time-scale",
    type=click.FloatRange(min=1),
    default=DEFAULT_TIME_SCALE,
    show_default=True,
    help="Simulated seconds per real second (fault schedules).",
)
@click.option("--deployment", help="Deployment name (default demo-<UTC time>).")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the HTML report (default <state dir>/demo/<deployment>/).",
)
@click.option("--policy", metavar="PATH|default", help="Verdict policy YAML.")
@click.option(
    "--database-url",
    metavar="URL",
    help="The store (default SHADOW_AB_DATABASE_URL, else SQLite in the state dir).",
)
@click.option(
    "--kafka",
    is_flag=False,
    flag_value="env",
    default=None,
    metavar="[HOST:PORT]",
    help="Send records through Kafka and `shadow-ab ingest` (bare: the local broker).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Traffic seed.")
@click.option(
    "--engines",
    type=click.Choice(ENGINE_CHOICES),
    default="sim",
    show_default=True,
    help="sim: simulators (vLLM- and TensorRT-LLM-flavored); vllm-cpu: two real vLLMs on this"
    " machine's CPU, bf16 incumbent and fp32 candidate on a tiny random model (after"
    " `shadow-ab engine vllm prepare`; --scenario and --time-scale do not apply).",
)
def demo(
    duration_s: float,
    scenario: str,
    incumbent_scenario: str,
    time_scale: float,
    deployment: str | None,
    output: Path | None,
    policy: str | None,
    database_url: str | None,
    kafka: str | None,
    seed: int,
    engines: str,
) -> None:
    """Run a shadow deployment on simulators (or real vLLM on CPU) and write its review."""
    from evaluator.policy import PolicyError
    from shadow_ab.dev.processes import ProcessError

    try:
        result = run_demo(
            duration_s=duration_s,
            scenario=scenario,
            incumbent_scenario=incumbent_scenario,
            time_scale=time_scale,
            deployment=deployment,
            output=output,
            policy_path=policy,
            database_url=database_url,
            kafka=kafka,
            seed=seed,
            engines=engines,
        )
    except PolicyError as exc:
        raise click.UsageError(str(exc)) from None
    except (DemoError, ProcessError) as exc:
        _say(f"error: {exc}")
        raise SystemExit(1) from exc
    click.echo(f"verdict: {result.decision} ({result.reason})")
    click.echo(f"report:  {result.report_path}")
    what = (
        "real vLLM on CPU, bf16 vs fp32 on a tiny random model: divergence is about numerics,"
        " latency about plumbing"
        if engines == "vllm-cpu"
        else "simulated engines: the verdict shows what the evaluator finds, not how vLLM and"
        " TensorRT-LLM compare"
    )
    click.echo(
        f"(deployment {result.deployment} in {result.database_url}, report #{result.report_id};"
        f" {what})"
    )
