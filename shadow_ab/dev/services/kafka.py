"""A single-node Apache Kafka broker in KRaft mode, resolved from Maven Central.

``kafka-pom.xml`` (beside this file) names the broker (``org.apache.kafka:kafka_2.13``) and a
logging backend; Maven copies the jars into ``var/services/kafka/libs`` (its own cache,
``~/.m2``, makes later resolutions fast), the storage is formatted on the first start, and the
broker runs as ``java -cp libs/* kafka.Kafka server.properties``, combined broker + controller,
listening on loopback only.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from importlib import resources
from typing import Any

from shadow_ab.dev.services.base import (
    LOOPBACK,
    PortTakenError,
    ServiceError,
    ServicesSettings,
    ServiceStatus,
    apt_install,
    pid_alive,
    port_open,
    run,
    wait_until,
)


def _resource(name: str) -> bytes:
    return resources.files("shadow_ab.dev.services").joinpath(name).read_bytes()


def new_cluster_id(random_uuid: Callable[[], uuid.UUID] = uuid.uuid4) -> str:
    """A KRaft cluster id made as Kafka's own ``Uuid.randomUuid()`` makes one.

    A random UUID as unpadded base64url, drawn again while it is one of Kafka's reserved ids
    (0, and 1 for the metadata topic) or its text starts with '-', which about one id in 64
    does and which a command line would read as an option.
    """
    while True:
        drawn = random_uuid()
        text = base64.urlsafe_b64encode(drawn.bytes).decode().rstrip("=")
        if drawn.int > 1 and not text.startswith("-"):
            return text


class LocalKafka:
    name = "kafka"

    def __init__(self, settings: ServicesSettings) -> None:
        self.port = settings.kafka_port
        self.controller_port = settings.kafka_controller_port
        self.heap = settings.kafka_heap
        self.home = settings.root / "kafka"
        self.libs = self.home / "libs"
        self.data = self.home / "data"
        self.logs = self.home / "logs"
        self.pid_file = self.home / "kafka.pid"
        self.config = self.home / "server.properties"

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    # -- install -----------------------------------------------------------------------------

    def _java(self) -> str:
        if shutil.which("java") is None:
            apt_install("default-jre-headless")
        java = shutil.which("java")
        if java is None:
            raise ServiceError("java is still missing after installing default-jre-headless")
        return java

    def _resolve_jars(self) -> None:
        pom = _resource("kafka-pom.xml")
        stamp = self.libs / ".pom-sha256"
        digest = hashlib.sha256(pom).hexdigest()
        if stamp.exists() and stamp.read_text() == digest:
            return
        if shutil.which("mvn") is None:
            apt_install("maven")
        self.home.mkdir(parents=True, exist_ok=True)
        pom_path = self.home / "pom.xml"
        pom_path.write_bytes(pom)
        if self.libs.exists():
            shutil.rmtree(self.libs)
        run(
            [
                "mvn",
                "-q",
                "-B",
                "-f",
                str(pom_path),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={self.libs}",
            ],
            "resolving the Kafka broker from Maven Central",
            timeout_s=900,
        )
        if not any(self.libs.glob("kafka_2.13-*.jar")):
            raise ServiceError(f"Maven ran but no kafka_2.13 jar is in {self.libs}")
        stamp.write_text(digest)

    def _write_config(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.config.write_text(
            "# Written by `shadow-ab services up`; edits are overwritten on the next start.\n"
            "process.roles=broker,controller\n"
            "node.id=1\n"
            f"controller.quorum.voters=1@{LOOPBACK}:{self.controller_port}\n"
            f"listeners=PLAINTEXT://{LOOPBACK}:{self.port},"
            f"CONTROLLER://{LOOPBACK}:{self.controller_port}\n"
            f"advertised.listeners=PLAINTEXT://{LOOPBACK}:{self.port}\n"
            "controller.listener.names=CONTROLLER\n"
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n"
            "inter.broker.listener.name=PLAINTEXT\n"
            f"log.dirs={self.data}\n"
            "num.partitions=3\n"
            "offsets.topic.replication.factor=1\n"
            "offsets.topic.num.partitions=10\n"
            "transaction.state.log.replication.factor=1\n"
            "transaction.state.log.min.isr=1\n"
            "group.initial.rebalance.delay.ms=0\n"
            "log.retention.hours=168\n"
            "auto.create.topics.enable=false\n"
        )
        (self.home / "log4j2.properties").write_bytes(_resource("kafka-log4j2.properties"))

    def _classpath(self) -> str:
        return f"{self.libs}/*"

    def _format(self, java: str) -> None:
        if (self.data / "meta.properties").exists():
            return
        cluster_id = new_cluster_id()
        run(
            [
                java,
                f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
                f"-Dkafka.logs.dir={self.logs}",
                "-cp",
                self._classpath(),
                "kafka.tools.StorageTool",
                "format",
                f"--cluster-id={cluster_id}",  # one argument, whatever the id's first character
                "-c",
                str(self.config),
            ],
            "formatting Kafka's KRaft storage",
            timeout_s=120,
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def running(self) -> bool:
        return pid_alive(self.pid_file) is not None and port_open(self.port)

    def up(self) -> None:
        if self.running():
            return
        for port in (self.port, self.controller_port):
            if port_open(port) and pid_alive(self.pid_file) is None:
                raise PortTakenError(
                    f"port {port} is taken by another process; stop it or pick other ports with"
                    " SHADOW_AB_KAFKA_PORT / SHADOW_AB_KAFKA_CONTROLLER_PORT"
                )
        java = self._java()
        self._resolve_jars()
        self._write_config()
        self._format(java)
        if pid_alive(self.pid_file) is None:
            self._start(java)
        wait_until(
            self._accepts_clients,
            90,
            "Kafka",
            f"see {self.logs / 'server.log'} and {self.logs / 'stdout.log'}",
        )

    def _start(self, java: str) -> None:
        out = (self.logs / "stdout.log").open("ab")
        proc = subprocess.Popen(
            [
                java,
                f"-Xms{self.heap}",
                f"-Xmx{self.heap}",
                "-XX:+UseG1GC",
                "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
                f"-Dkafka.logs.dir={self.logs}",
                "-cp",
                self._classpath(),
                "kafka.Kafka",
                str(self.config),
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives this command, like a daemon
        )
        out.close()
        self.pid_file.write_text(str(proc.pid))

    def _accepts_clients(self) -> bool:
        if pid_alive(self.pid_file) is None:
            tail = ""
            log = self.logs / "stdout.log"
            if log.exists():
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-10:])
            raise ServiceError(f"Kafka exited during start-up; see {self.logs}\n{tail}")
        if not port_open(self.port):
            return False
        # imported late: only `up` needs it
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "client.id": "shadow-ab",
            "logger": logging.getLogger("shadow_ab.services.librdkafka"),
        }
        admin = AdminClient(config)
        try:
            admin.list_topics(timeout=5.0)
            return True
        except KafkaException:
            return False

    def down(self) -> None:
        pid = pid_alive(self.pid_file)
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and pid_alive(self.pid_file) is not None:
            time.sleep(0.2)
        if pid_alive(self.pid_file) is not None:
            os.kill(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)

    def status(self) -> ServiceStatus:
        up = self.running()
        if up:
            detail = f"pid {pid_alive(self.pid_file)}, KRaft single node"
        else:
            detail = "stopped" if self.data.exists() else "not installed"
        return ServiceStatus(self.name, up, self.bootstrap, detail)

    def env(self) -> dict[str, str]:
        return {"SHADOW_AB_KAFKA_BOOTSTRAP": self.bootstrap}


def kafka_version_in_pom() -> str:
    """The broker version named in the shipped pom (for `status`)."""
    text = _resource("kafka-pom.xml").decode()
    start = text.index("<kafka.version>") + len("<kafka.version>")
    return text[start : text.index("</kafka.version>")]
