"""A private, throw-away Kafka broker for tests that stop and start Kafka.

The shared broker from ``shadow-ab services up`` must never be stopped (other engineers' tests
use it), so a test that needs a Kafka outage starts its own: :class:`shadow_ab.dev.services.kafka.
LocalKafka` with its own :class:`ServicesSettings` (state folder under the test's tmp path, free
ports, a small heap). The broker jars are linked from the shared install when it has resolved
the same pom (no Maven run, start takes ~10 s); otherwise Maven resolves them from its cache.

::

    with private_kafka(tmp_path) as kafka:
        ensure_topics(kafka.bootstrap, [...])
        kafka.stop()        # an outage
        kafka.start()       # same data folder: topics and offsets are kept
"""

from __future__ import annotations

import contextlib
import os
import signal
import warnings
from collections.abc import Iterator
from pathlib import Path

from shadow_ab.dev.processes import free_port
from shadow_ab.dev.services.base import ServicesSettings, pid_alive, port_open
from shadow_ab.dev.services.kafka import LocalKafka


class PrivateKafka:
    """One single-node KRaft broker of this test alone."""

    def __init__(self, root: Path, *, heap: str = "384m") -> None:
        settings = ServicesSettings(
            kafka_port=free_port(),
            kafka_controller_port=free_port(),
            kafka_heap=heap,
            root=root,
        )
        self.kafka = LocalKafka(settings)
        self._link_shared_jars()

    @property
    def bootstrap(self) -> str:
        return self.kafka.bootstrap

    @property
    def port(self) -> int:
        return self.kafka.port

    def _link_shared_jars(self) -> None:
        shared = LocalKafka(ServicesSettings()).libs
        stamp = shared / ".pom-sha256"
        if stamp.exists() and any(shared.glob("kafka_2.13-*.jar")):
            self.kafka.home.mkdir(parents=True, exist_ok=True)
            if not self.kafka.libs.exists():
                os.symlink(shared, self.kafka.libs, target_is_directory=True)

    def start(self) -> None:
        """Start the broker (formatting its storage the first time) and wait for clients."""
        with warnings.catch_warnings():
            # LocalKafka starts the broker like a daemon and lets go of its Popen object, whose
            # __del__ warns that the process still runs: intended here, the broker outlives it.
            warnings.simplefilter("ignore", ResourceWarning)
            self.kafka.up()

    def stop(self, *, kill: bool = False) -> None:
        """Stop the broker: SIGTERM and wait (or SIGKILL, a crash), until the port is closed."""
        if kill:
            pid = pid_alive(self.kafka.pid_file)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
            self.kafka.pid_file.unlink(missing_ok=True)
        else:
            self.kafka.down()

    def running(self) -> bool:
        return self.kafka.running() and port_open(self.kafka.port)

    def log_tail(self, lines: int = 30) -> str:
        path = self.kafka.logs / "server.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def private_kafka(root: Path, *, heap: str = "384m") -> Iterator[PrivateKafka]:
    """A started private broker under ``root``, stopped (killed if need be) on exit."""
    broker = PrivateKafka(root, heap=heap)
    try:
        broker.start()
        yield broker
    finally:
        broker.stop(kill=False) if broker.running() else broker.stop(kill=True)
