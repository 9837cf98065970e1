"""Start simulators and mirrors from Python: for the demo, the benchmarks and the tests.

::

    with running_pair(("vllm", "clean"), ("trtllm", "leaky"), time_scale=3600) as (inc, cand):
        with running_mirror(inc.base_url, cand.base_url, shadow={"rate": 0.5}) as mirror:
            openai.OpenAI(base_url=mirror.v1, api_key="x")...
            mirror.metric("shadow_ab_mirror_shadow_decisions_total", decision="sampled")
        # records are in mirror.database_url (a SQLite file in a temporary folder by default)
        cand.ledger()         # every line the candidate injected so far

One launcher underneath, :class:`ManagedProcess`: a subprocess whose stderr goes to a log
file, a wait until it is ready (failing with the log's tail when it exits first or takes too
long), and a stop that sends SIGTERM and, when that is ignored, SIGKILL; optionally in a process
group of its own, stopped or killed as a whole (real engines with their workers,
:mod:`shadow_ab.dev.engines.vllm_cpu`). :func:`running_sim`
runs ``shadow-ab sim`` (supervisor + serving child) and :func:`running_mirror` runs
``shadow-ab mirror``, each on a free 127.0.0.1 port (:func:`free_port`), picking another when
someone takes the port between the probe and the bind.

The mirror is configured by a YAML file built from the keyword arguments (any
:class:`~mirror.config.MirrorSettings` field, nested sections as dicts). The project-wide
``SHADOW_AB_DATABASE_URL`` and ``SHADOW_AB_KAFKA_BOOTSTRAP`` are not passed on: records go where
the arguments say. :meth:`RunningMirror.stop` waits for the drain and the sink flush.

Errors::

    ProcessError            a managed process did not start or stop as asked
      SimulatorError        ... a simulator
      MirrorStartError      ... a mirror
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

import yaml

from simulator.ledger import read_ledger
from simulator.scenario import Flavor, load_scenario


class ProcessError(RuntimeError):
    """A managed process did not start or stop as asked."""


class SimulatorError(ProcessError):
    """The simulator did not start or stop as asked."""


class MirrorStartError(ProcessError):
    """The mirror did not start or stop as asked."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (bound once to pick it, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_port_run(count: int, host: str = "127.0.0.1") -> int:
    """The first of ``count`` consecutive TCP ports nothing listens on right now, for a process
    that serves on ``port + i`` (the ingester's workers' metrics). Taken below the kernel's
    ephemeral range, where :func:`free_port` and every outgoing connection take theirs, so
    another test cannot be handed one of them in between; ``RuntimeError`` when 200 random
    tries found none."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    picker = random.Random()
    for _ in range(200):
        base = picker.randrange(10_000, max(10_001, ephemeral_low - count))
        taken = []
        try:
            for port in range(base, base + count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                taken.append(s)
                s.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for s in taken:
                s.close()
    raise RuntimeError(f"no {count} consecutive free TCP ports found below {ephemeral_low}")


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """GET ``url``: (status, body); status 0 when nothing answers (connection refused)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return 0, b""


# -- the launcher --------------------------------------------------------------------------


class ManagedProcess:
    """One subprocess with its stderr (and, with ``merge_stdout``, its stdout) in ``log_path``.

    ``name`` and ``error`` say what the failures are called and raised as. With
    ``new_session`` the process leads a process group of its own (``start_new_session``): what
    it starts (an engine's workers) is stopped with it (SIGKILL to the group once the leader
    has exited or been killed), and :meth:`kill` kills the whole group, as a crash would.
    :meth:`relaunch` starts the same command again (appending to the log).
    """

    name: ClassVar[str] = "process"
    error: ClassVar[type[ProcessError]] = ProcessError
    log_chars: ClassVar[int] = 4000
    stop_timeout: ClassVar[float] = 15.0

    def __init__(
        self,
        cmd: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        merge_stdout: bool = False,
        new_session: bool = False,
        cwd: Path | None = None,
    ) -> None:
        self.cmd = list(cmd)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.merge_stdout = merge_stdout
        self.new_session = new_session
        self.cwd = cwd
        self.process: subprocess.Popen[bytes] = self._spawn("wb")

    def _spawn(self, mode: str) -> subprocess.Popen[bytes]:
        with open(self.log_path, mode) as log:
            return subprocess.Popen(
                self.cmd,
                stdin=subprocess.DEVNULL,
                stdout=log if self.merge_stdout else subprocess.DEVNULL,
                stderr=log,
                env=self.env,
                cwd=self.cwd,
                start_new_session=self.new_session,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def stderr(self) -> str:
        """The end of the process's log (empty when it cannot be read)."""
        try:
            return self.log_path.read_text(errors="replace")[-self.log_chars :]
        except OSError:
            return ""

    def wait_until(
        self, ready: Callable[[], bool], state: str, timeout: float, interval: float = 0.02
    ) -> None:
        """Poll ``ready`` until it is true; raise when the process exits first or after
        ``timeout`` seconds, with the log's tail."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise self.error(
                    f"{self.name} exited with {self.process.returncode}:\n{self.stderr()}"
                )
            if ready():
                return
            time.sleep(interval)
        raise self.error(f"{self.name} not {state} within {timeout}s:\n{self.stderr()}")

    def stop(self, timeout: float | None = None, sig: int = signal.SIGTERM) -> int:
        """Send ``sig`` (SIGTERM) and wait up to ``timeout`` seconds for the exit code; a
        process that ignores it is killed (SIGKILL) and the error is raised. With
        ``new_session``, what is left of its group is killed once it has exited."""
        if self.process.poll() is not None:
            self._kill_group()
            return int(self.process.returncode)
        timeout = self.stop_timeout if timeout is None else timeout
        self.process.send_signal(sig)
        try:
            return int(self.process.wait(timeout))
        except subprocess.TimeoutExpired:
            self.kill()
            raise self.error(
                f"{self.name} ignored {signal.Signals(sig).name} for {timeout}s; killed:\n"
                + self.stderr()
            ) from None
        finally:
            self._kill_group()

    def kill(self) -> int:
        """SIGKILL to the process (to its whole group with ``new_session``), as a crash; its
        exit code."""
        if self.new_session:
            self._kill_group()
        elif self.process.poll() is None:
            self.process.kill()
        return int(self.process.wait())

    def relaunch(self) -> None:
        """Start the command again (once this process has exited), appending to the log."""
        if self.process.poll() is None:
            raise self.error(f"{self.name} (pid {self.pid}) is still running: stop it first")
        self._kill_group()
        self.process = self._spawn("ab")

    def _kill_group(self) -> None:
        if self.new_session:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)


class ServingProcess(ManagedProcess):
    """A managed process that serves HTTP on ``host:port``."""

    def __init__(
        self,
        cmd: Sequence[str],
        log_path: Path,
        host: str,
        port: int,
        *,
        env: Mapping[str, str] | None = None,
        merge_stdout: bool = False,
        new_session: bool = False,
        cwd: Path | None = None,
    ) -> None:
        super().__init__(
            cmd, log_path, env=env, merge_stdout=merge_stdout, new_session=new_session, cwd=cwd
        )
        self.host = host
        self.port = port

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def v1(self) -> str:
        """The OpenAI-style base URL (``.../v1``)."""
        return self.base_url + "/v1"


P = TypeVar("P", bound=ManagedProcess)


@contextlib.contextmanager
def on_free_port(
    start: Callable[[int], P], kind: type[P], *, host: str, port: int | None, port_taken: str
) -> Iterator[P]:
    """``start(port)`` on ``port``, or on a free port when None, stopped when the block ends.

    ``start`` launches a ``kind`` process and waits until it is ready; when that fails with an
    error whose text holds ``port_taken`` (someone took the free port between the probe and the
    bind), it is tried again on another port, three times in all."""
    last_error = ""
    for _attempt in range(3):
        chosen = port or free_port(host)
        try:
            proc = start(chosen)
        except ProcessError as exc:
            last_error = str(exc)
            if port_taken in last_error.lower() and port is None:
                continue
            raise
        try:
            yield proc
        finally:
            proc.stop()
        return
    raise kind.error(f"could not start a {kind.name}: {last_error}")


def _launch(proc: P, wait: Callable[[P], None], stop_timeout: float | None = None) -> P:
    """``wait(proc)``; on failure stop ``proc`` (its own stop error aside) and re-raise."""
    try:
        wait(proc)
    except ProcessError:
        with contextlib.suppress(ProcessError):
            proc.stop(stop_timeout)
        raise
    return proc


# -- simulators ----------------------------------------------------------------------------


class RunningSim(ServingProcess):
    """A ``shadow-ab sim`` subprocess."""

    name = "simulator"
    error = SimulatorError

    def __init__(
        self,
        flavor: Flavor,
        host: str,
        port: int,
        ledger_path: Path | None,
        cmd: Sequence[str],
        log_path: Path,
    ) -> None:
        super().__init__(cmd, log_path, host, port, env=os.environ)
        self.flavor = flavor
        self.ledger_path = ledger_path

    def ledger(self) -> list[dict[str, Any]]:
        return read_ledger(self.ledger_path) if self.ledger_path else []

    def healthy(self) -> bool:
        return http_get(self.base_url + "/health", timeout=1.0)[0] == 200

    def listening(self) -> bool:
        """Whether anything answers HTTP on the port (healthy or not)."""
        return http_get(self.base_url + "/health", timeout=1.0)[0] != 0

    def wait_healthy(self, timeout: float = 30.0) -> None:
        self.wait_until(self.healthy, "healthy", timeout)

    def wait_listening(self, timeout: float = 30.0) -> None:
        self.wait_until(self.listening, "listening", timeout)

    def wait_down(self, timeout: float = 30.0) -> None:
        """Wait until nothing answers on the port (the serving process is gone)."""
        self.wait_until(lambda: not self.listening(), "down", timeout)


def _scenario_file(
    scenario: str | Path | dict[str, Any] | None,
    workdir: Path,
    flavor: Flavor,
    overrides: dict[str, Any],
) -> Path | None:
    if scenario is None and not overrides:
        return None
    raw: dict[str, Any]
    if isinstance(scenario, dict):
        raw = dict(scenario)
    elif scenario is None:
        raw = {}
    else:
        from simulator.scenario import read_raw

        raw, _ = read_raw(scenario)
    from simulator.scenario import _deep_merge

    raw = _deep_merge(raw, overrides)
    load_scenario(None, flavor, **raw)  # fail here, in the caller, with the scenario's error
    path = workdir / "scenario.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@contextlib.contextmanager
def running_sim(
    flavor: Flavor = "vllm",
    scenario: str | Path | dict[str, Any] | None = None,
    *,
    overrides: dict[str, Any] | None = None,
    time_scale: float | None = None,
    ledger: Path | str | bool | None = True,
    host: str = "127.0.0.1",
    port: int | None = None,
    startup_timeout: float = 30.0,
    wait_for: Literal["healthy", "listening"] = "healthy",
) -> Iterator[RunningSim]:
    """Run one simulator subprocess for the duration of the ``with`` block.

    ``scenario`` is a shipped name, a YAML path, or a mapping; ``overrides`` are deep-merged on
    top (e.g. ``{"latency": {"decode_ms": 0.5}}``). ``ledger=True`` writes one in a temporary
    directory (``sim.ledger_path``), a path writes there, ``False``/``None`` writes none.
    ``wait_for="listening"`` returns once anything answers (for scenarios unhealthy at start).
    """
    with tempfile.TemporaryDirectory(prefix="shadow-ab-sim-test-") as tmp:
        workdir = Path(tmp)
        merged = dict(overrides or {})
        if time_scale is not None:
            merged["time_scale"] = time_scale
        config = _scenario_file(scenario, workdir, flavor, merged)
        if ledger is True:
            ledger_path: Path | None = workdir / "ledger.jsonl"
        elif ledger in (False, None):
            ledger_path = None
        else:
            ledger_path = Path(str(ledger))

        def start(chosen: int) -> RunningSim:
            cmd = [sys.executable, "-m", "simulator", "--flavor", flavor, "--port", str(chosen)]
            cmd += ["--host", host]
            if config is not None:
                cmd += ["--config", str(config)]
            cmd += ["--ledger", str(ledger_path)] if ledger_path else ["--no-ledger"]
            sim = RunningSim(
                flavor, host, chosen, ledger_path, cmd, workdir / f"stderr-{chosen}.log"
            )
            if wait_for == "healthy":
                return _launch(sim, lambda s: s.wait_healthy(startup_timeout))
            return _launch(sim, lambda s: s.wait_listening(startup_timeout))

        with on_free_port(
            start, RunningSim, host=host, port=port, port_taken="cannot listen"
        ) as sim:
            yield sim


@contextlib.contextmanager
def running_pair(
    incumbent: tuple[Flavor, str | Path | dict[str, Any] | None] = ("vllm", "clean"),
    candidate: tuple[Flavor, str | Path | dict[str, Any] | None] = ("trtllm", "clean"),
    **common: Any,
) -> Iterator[tuple[RunningSim, RunningSim]]:
    """An incumbent and a candidate simulator, each ``(flavor, scenario)``; ``common`` keyword
    arguments (``overrides``, ``time_scale`` ...) go to both :func:`running_sim` calls."""
    with (
        running_sim(incumbent[0], incumbent[1], **common) as inc,
        running_sim(candidate[0], candidate[1], **common) as cand,
    ):
        yield inc, cand


# -- mirrors -------------------------------------------------------------------------------


class RunningMirror(ServingProcess):
    """A ``shadow-ab mirror`` subprocess."""

    name = "mirror"
    error = MirrorStartError
    log_chars = 6000
    stop_timeout = 60.0

    def __init__(
        self,
        host: str,
        port: int,
        database_url: str | None,
        config_path: Path,
        cmd: Sequence[str],
        log_path: Path,
        env: Mapping[str, str],
        admin_port: int | None = None,
    ) -> None:
        super().__init__(cmd, log_path, host, port, env=env)
        self.database_url = database_url
        self.config_path = config_path
        self.admin_port = admin_port if admin_port is not None else port

    @property
    def admin_url(self) -> str:
        """The admin port's root (``/metrics``, ``/healthz``, ``/mirror/docs``)."""
        return f"http://{self.host}:{self.admin_port}"

    def metrics_text(self) -> str:
        status, body = http_get(self.admin_url + "/metrics", timeout=5.0)
        if status != 200:
            raise MirrorStartError(f"GET /metrics answered {status}")
        return body.decode()

    def metric(self, name: str, **labels: str) -> float:
        """The sum of one metric's samples whose labels include ``labels`` (0 when absent)."""
        from prometheus_client.parser import text_string_to_metric_families

        total = 0.0
        for family in text_string_to_metric_families(self.metrics_text()):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    total += sample.value
        return total

    def healthy(self) -> bool:
        return http_get(self.admin_url + "/healthz", timeout=1.0)[0] == 200


@contextlib.contextmanager
def running_mirror(
    incumbent_url: str,
    candidate_url: str,
    *,
    database_url: str | None = None,
    kafka: str | None = None,
    kafka_settings: dict[str, Any] | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    startup_timeout: float = 60.0,
    env: dict[str, str] | None = None,
    health_only: bool = False,
    **overrides: Any,
) -> Iterator[RunningMirror]:
    """Run one ``shadow-ab mirror`` subprocess for the duration of the ``with`` block.

    Records go to ``database_url`` (default: a SQLite file in a temporary folder, migrated by
    the mirror), or to Kafka at ``kafka`` (``HOST:PORT``; ``kafka_settings`` are the rest of
    the sink's ``kafka:`` settings, e.g. its topics). ``overrides`` are settings, e.g.
    ``shadow={"rate": 0.5, "replay_rate": 0.1}``, ``deployment="exp1"``,
    ``candidate={"rewrite": {"model_map": {"*": "m"}}}`` (merged with the URLs),
    ``health_enabled=False``.
    ``health_only=True`` runs ``shadow-ab mirror --health-only`` (the sampler and its /metrics).
    With ``workers=N`` the mirror runs N worker processes; worker i's admin port is
    ``mirror.admin_port + i``.
    Probes are off unless ``probes={"per_minute": ...}`` is given (the mirror's default is one a
    minute): a test or benchmark counts the traffic it sends.
    The admin endpoints are on another free port (``mirror.admin_url``; the sampler's on its
    one port).
    """
    with tempfile.TemporaryDirectory(prefix="shadow-ab-mirror-test-") as tmp:
        workdir = Path(tmp)
        settings: dict[str, Any] = dict(overrides)
        settings["probes"] = {"per_minute": 0, **settings.get("probes", {})}
        settings["incumbent"] = {**settings.get("incumbent", {}), "url": incumbent_url}
        settings["candidate"] = {**settings.get("candidate", {}), "url": candidate_url}
        if kafka is not None and kafka_settings:
            settings["kafka"] = {"bootstrap": kafka, **kafka_settings}
        if kafka is None and database_url is None:
            database_url = f"sqlite:///{workdir / 'records.db'}"
        config_path = workdir / "mirror.yaml"
        config_path.write_text(yaml.safe_dump(settings, sort_keys=False))
        child_env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("SHADOW_AB_DATABASE_URL", "SHADOW_AB_KAFKA_BOOTSTRAP")
            and not k.startswith("SHADOW_AB_MIRROR_")
        }
        child_env.setdefault("SHADOW_AB_HOME", str(workdir / "home"))
        child_env.update(env or {})

        def start(chosen: int) -> RunningMirror:
            cmd = [sys.executable, "-m", "shadow_ab", "mirror", "--config", str(config_path)]
            cmd += ["--host", host, "--port", str(chosen)]
            admin_port = None
            if health_only:
                cmd.append("--health-only")
            else:
                workers = int(settings.get("workers", 1))
                # Worker i serves on admin_port + i: a free run of them (free_port_run).
                admin_port = free_port_run(workers, host) if workers > 1 else free_port(host)
                cmd += ["--admin-port", str(admin_port)]
            if kafka is not None:
                cmd += ["--kafka", kafka]
            if database_url is not None:
                cmd += ["--database-url", database_url]
            log_path = workdir / f"stderr-{chosen}.log"
            mirror = RunningMirror(
                host, chosen, database_url, config_path, cmd, log_path, child_env, admin_port
            )
            return _launch(
                mirror,
                lambda m: m.wait_until(m.healthy, "healthy", startup_timeout, interval=0.03),
                stop_timeout=10.0,
            )

        with on_free_port(
            start, RunningMirror, host=host, port=port, port_taken="address already in use"
        ) as mirror:
            yield mirror
