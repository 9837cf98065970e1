"""Start simulators from Python: for tests, the demo and the benchmarks.

::

    with running_sim("trtllm", "leaky", time_scale=3600) as sim:
        client = openai.OpenAI(base_url=sim.v1, api_key="x")
        ...
        sim.ledger()          # every line injected so far

The simulator runs as a real ``shadow-ab sim`` subprocess (supervisor + serving child) on a
free 127.0.0.1 port; the context manager waits for ``/health``, yields a :class:`RunningSim`
and stops the process tree on exit, raising :class:`SimulatorError` with the simulator's
stderr if it does not come up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from simulator.ledger import read_ledger
from simulator.scenario import Flavor, load_scenario


class SimulatorError(RuntimeError):
    """The simulator did not start or stop as asked."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """GET ``url``: (status, body); status 0 when nothing answers (connection refused)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return 0, b""


@dataclass
class RunningSim:
    flavor: Flavor
    host: str
    port: int
    ledger_path: Path | None
    process: subprocess.Popen[bytes]
    stderr_path: Path

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def v1(self) -> str:
        """The OpenAI-style base URL (``.../v1``)."""
        return self.base_url + "/v1"

    def ledger(self) -> list[dict[str, Any]]:
        return read_ledger(self.ledger_path) if self.ledger_path else []

    def healthy(self) -> bool:
        return http_get(self.base_url + "/health", timeout=1.0)[0] == 200

    def listening(self) -> bool:
        """Whether anything answers HTTP on the port (healthy or not)."""
        return http_get(self.base_url + "/health", timeout=1.0)[0] != 0

    def wait_healthy(self, timeout: float = 30.0) -> None:
        self._wait(self.healthy, "healthy", timeout)

    def wait_listening(self, timeout: float = 30.0) -> None:
        self._wait(self.listening, "listening", timeout)

    def wait_down(self, timeout: float = 30.0) -> None:
        """Wait until nothing answers on the port (the serving process is gone)."""
        self._wait(lambda: not self.listening(), "down", timeout)

    def _wait(self, done: Callable[[], bool], state: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SimulatorError(
                    f"simulator exited with {self.process.returncode}:\n{self.stderr()}"
                )
            if done():
                return
            time.sleep(0.02)
        raise SimulatorError(f"simulator not {state} within {timeout}s:\n{self.stderr()}")

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text()[-4000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise SimulatorError(f"simulator ignored SIGTERM for {timeout}s; killed") from None


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
        last_error = ""
        for _attempt in range(3):
            chosen = port or free_port(host)
            cmd = [sys.executable, "-m", "simulator", "--flavor", flavor, "--port", str(chosen)]
            cmd += ["--host", host]
            if config is not None:
                cmd += ["--config", str(config)]
            cmd += ["--ledger", str(ledger_path)] if ledger_path else ["--no-ledger"]
            stderr_path = workdir / f"stderr-{chosen}.log"
            with open(stderr_path, "wb") as err:
                proc = subprocess.Popen(
                    cmd, stdout=subprocess.DEVNULL, stderr=err, env={**os.environ}
                )
            sim = RunningSim(flavor, host, chosen, ledger_path, proc, stderr_path)
            try:
                if wait_for == "healthy":
                    sim.wait_healthy(startup_timeout)
                else:
                    sim.wait_listening(startup_timeout)
            except SimulatorError as exc:
                last_error = str(exc)
                sim.stop()
                if "cannot listen" in last_error and port is None:
                    continue  # someone took the port between our probe and the bind
                raise
            try:
                yield sim
            finally:
                sim.stop()
            return
        raise SimulatorError(f"could not start a simulator: {last_error}")


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
