"""Start a mirror from Python: for tests, the benchmarks and the demo.

::

    with running_pair(("vllm", "clean"), ("trtllm", "clean")) as (inc, cand):
        with running_mirror(inc.base_url, cand.base_url, shadow={"rate": 0.5}) as mirror:
            openai.OpenAI(base_url=mirror.v1, api_key="x")...
            mirror.metric("shadow_ab_mirror_shadow_decisions_total", decision="sampled")
        # records are in mirror.database_url (a SQLite file in a temporary folder by default)

The mirror runs as a real ``shadow-ab mirror`` subprocess on a free 127.0.0.1 port, configured
by a YAML file built from the keyword arguments (any :class:`~mirror.config.MirrorSettings`
field, nested sections as dicts). The project-wide ``SHADOW_AB_DATABASE_URL`` and
``SHADOW_AB_KAFKA_BOOTSTRAP`` are not passed on: records go where the arguments say.
:meth:`RunningMirror.stop` sends SIGTERM and waits for the drain and the sink flush.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from simulator.testing import free_port, http_get


class MirrorStartError(RuntimeError):
    """The mirror did not start or stop as asked."""


@dataclass
class RunningMirror:
    host: str
    port: int
    process: subprocess.Popen[bytes]
    stderr_path: Path
    database_url: str | None
    config_path: Path

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def v1(self) -> str:
        """The OpenAI-style base URL (``.../v1``)."""
        return self.base_url + "/v1"

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text()[-6000:]
        except OSError:
            return ""

    def metrics_text(self) -> str:
        status, body = http_get(self.base_url + "/metrics", timeout=5.0)
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
        return http_get(self.base_url + "/healthz", timeout=1.0)[0] == 200

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then wait for the drain and the sink flush; the exit code."""
        if self.process.poll() is not None:
            return int(self.process.returncode)
        self.process.send_signal(signal.SIGTERM)
        try:
            return int(self.process.wait(timeout))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise MirrorStartError(
                f"mirror ignored SIGTERM for {timeout}s; killed:\n{self.stderr()}"
            ) from None


def _wait_healthy(mirror: RunningMirror, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if mirror.process.poll() is not None:
            raise MirrorStartError(
                f"mirror exited with {mirror.process.returncode}:\n{mirror.stderr()}"
            )
        if mirror.healthy():
            return
        time.sleep(0.03)
    raise MirrorStartError(f"mirror not healthy within {timeout}s:\n{mirror.stderr()}")


@contextlib.contextmanager
def running_mirror(
    incumbent_url: str,
    candidate_url: str,
    *,
    database_url: str | None = None,
    kafka: str | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    startup_timeout: float = 60.0,
    env: dict[str, str] | None = None,
    health_only: bool = False,
    **overrides: Any,
) -> Iterator[RunningMirror]:
    """Run one ``shadow-ab mirror`` subprocess for the duration of the ``with`` block.

    Records go to ``database_url`` (default: a SQLite file in a temporary folder, migrated by
    the mirror), or to Kafka at ``kafka`` (``HOST:PORT``). ``overrides`` are settings, e.g.
    ``shadow={"rate": 0.5, "replay_rate": 0.1}``, ``deployment="exp1"``,
    ``candidate={"rewrite": {"model": "m"}}`` (merged with the URLs), ``health_enabled=False``.
    ``health_only=True`` runs ``shadow-ab mirror --health-only`` (the sampler and its /metrics).
    """
    with tempfile.TemporaryDirectory(prefix="shadow-ab-mirror-test-") as tmp:
        workdir = Path(tmp)
        settings: dict[str, Any] = dict(overrides)
        settings["incumbent"] = {**settings.get("incumbent", {}), "url": incumbent_url}
        settings["candidate"] = {**settings.get("candidate", {}), "url": candidate_url}
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
        last_error = ""
        for _attempt in range(3):
            chosen = port or free_port(host)
            cmd = [sys.executable, "-m", "shadow_ab", "mirror", "--config", str(config_path)]
            cmd += ["--host", host, "--port", str(chosen)]
            if health_only:
                cmd.append("--health-only")
            if kafka is not None:
                cmd += ["--kafka", kafka]
            if database_url is not None:
                cmd += ["--database-url", database_url]
            stderr_path = workdir / f"stderr-{chosen}.log"
            with open(stderr_path, "wb") as err:
                proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=child_env)
            mirror = RunningMirror(host, chosen, proc, stderr_path, database_url, config_path)
            try:
                _wait_healthy(mirror, startup_timeout)
            except MirrorStartError as exc:
                last_error = str(exc)
                with contextlib.suppress(MirrorStartError):
                    mirror.stop(10.0)
                if "address already in use" in last_error.lower() and port is None:
                    continue
                raise
            try:
                yield mirror
            finally:
                mirror.stop()
            return
        raise MirrorStartError(f"could not start a mirror: {last_error}")
