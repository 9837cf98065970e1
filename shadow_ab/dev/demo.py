"""``shadow-ab demo``: a whole shadow deployment on simulators, then its review.

::

    shadow-ab demo [--duration 180] [--scenario fast-crashy] [--incumbent-scenario noisy]
                   [--time-scale 600] [--deployment NAME] [-o PATH] [--policy P]
                   [--database-url URL] [--kafka [HOST:PORT]]

On the embedded defaults (the SQLite store under the state dir, the mirror's direct sink) it

1. starts a vLLM-flavor simulator as the incumbent (scenario ``noisy``: clean latencies, a 1 %
   near-tie noise floor) and a TensorRT-LLM-flavor simulator as the candidate (``--scenario``,
   default ``fast-crashy``: 20 % faster decode, crashes about twice a simulated day) -- both are
   ``shadow-ab sim`` (simulator/README.md), with simulated time running ``--time-scale`` times
   faster so the fault schedule of many hours fits in a few minutes (latencies stay real);
2. starts ``shadow-ab mirror`` in front of them (every request shadowed, 20 % replayed to the
   incumbent for the noise floor, the health sampler scraping both engines every second);
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
) -> None:
    """Create or fill in the deployment's row (the writers may have made a bare one)."""
    from storage.models import Deployment

    values = {
        "incumbent_engine": incumbent["engine"],
        "incumbent_version": incumbent["version"],
        "candidate_engine": candidate["engine"],
        "candidate_version": candidate["version"],
        "model": model,
        "hardware": SIMULATED_HARDWARE,
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

    env = {**os.environ, "SHADOW_AB_INGEST_AUTO_OFFSET_RESET": "earliest"}
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
) -> int:
    from shadow_ab.dev.traffic import (
        RequestGenerator,
        TrafficMix,
        make_plan,
        make_session,
        run_traffic,
    )

    generator = RequestGenerator(TrafficMix(), seed)  # one generator: sessions span the phases
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
    phases: tuple[int, ...] = CONCURRENCY_PHASES,
    seed: int = 0,
    progress: bool = True,
) -> DemoResult:
    """Run the demo (see the module docstring); the verdict and where the report went."""
    from evaluator.divergence import DivergenceConfig
    from evaluator.policy import load_policy
    from evaluator.review import build_review, default_analyses, resolve_window
    from shadow_ab.cli_support import resolve_url
    from shadow_ab.dev.processes import running_mirror, running_sim
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
    _say(
        "shadow-ab demo: the engines are SIMULATORS (shadow-ab sim), not vLLM or TensorRT-LLM;"
        " every figure in this run is generated by them."
    )
    started_at = datetime.now(UTC)
    try:
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
            incumbent = {
                "engine": f"vllm (simulator, scenario {incumbent_scenario})",
                "version": _engine_version(inc.base_url),
            }
            candidate = {
                "engine": f"tensorrt-llm (simulator, scenario {scenario})",
                "version": _engine_version(cand.base_url),
            }
            record_deployment(
                engine,
                name,
                incumbent=incumbent,
                candidate=candidate,
                model="sim-llama-3-8b-instruct",
                policy=policy.to_dict(),
                started_at=started_at,
            )
            _say(f"  incumbent  vLLM-flavor simulator ({incumbent_scenario}) at {inc.base_url}")
            _say(f"  candidate  TensorRT-LLM-flavor simulator ({scenario}) at {cand.base_url}")
            _say(
                f"  time       simulated time runs {time_scale:g}x: {_clock(duration_s)} here is"
                f" {duration_s * time_scale / 3600:.1f} simulated hours of faults; latencies are"
                " real-time"
            )
            mirror_kw: dict[str, Any] = {
                "deployment": name,
                "shadow": {"rate": 1.0, "replay_rate": REPLAY_RATE},
                "health": {"interval_s": HEALTH_INTERVAL_S},
                "incumbent": {"engine": "vllm@incumbent"},
                "candidate": {"engine": "trtllm@candidate"},
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
                            inc.base_url,
                            cand.base_url,
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
                            inc.base_url,
                            cand.base_url,
                            database_url=url,
                            startup_timeout=MIRROR_STARTUP_S,
                            **mirror_kw,
                        )
                    )
                    sink = f"direct sink -> {redact_url(url)}"
                _say(
                    f"  mirror     {mirror.base_url} (all requests shadowed, {REPLAY_RATE:.0%}"
                    f" replayed), records: {sink}"
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

                requests = asyncio.run(_drive(mirror.v1, duration_s, phases, seed, report))
                mirror.stop()
                if bootstrap:
                    _say("  waiting for the ingester to write the last records ...")
                    _wait_ingested(engine, name)
        ended_at = datetime.now(UTC)
        record_deployment(
            engine,
            name,
            incumbent=incumbent,
            candidate=candidate,
            model="sim-llama-3-8b-instruct",
            policy=policy.to_dict(),
            started_at=started_at,
            ended_at=ended_at,
        )
        stored = _count_exchanges(engine, name)
        if stored == 0:
            raise DemoError(
                f"the run recorded no exchanges in {redact_url(url)}: see the mirror's log"
            )
        _say(f"  {requests} client requests, {stored} exchanges stored; reviewing ...")
        window = resolve_window(engine, name)
        analyses = default_analyses(
            incident_config=compressed_incident_config(time_scale),
            divergence_config=DivergenceConfig(max_pairs_per_day=20_000, max_pairs=20_000),
        )
        review = build_review(engine, name, window, policy, analyses=analyses)
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
) -> None:
    """Run a shadow deployment on simulators and write its review."""
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
        )
    except PolicyError as exc:
        raise click.UsageError(str(exc)) from None
    except (DemoError, ProcessError) as exc:
        _say(f"error: {exc}")
        raise SystemExit(1) from exc
    click.echo(f"verdict: {result.decision} ({result.reason})")
    click.echo(f"report:  {result.report_path}")
    click.echo(
        f"(deployment {result.deployment} in {result.database_url}, report #{result.report_id};"
        " simulated engines: the verdict shows what the evaluator finds, not how vLLM and"
        " TensorRT-LLM compare)"
    )
