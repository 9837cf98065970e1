"""``shadow-ab services up|down|status|env``: local Kafka and PostgreSQL for development/tests."""

from __future__ import annotations

import shlex
import time

import click

from shadow_ab.dev.services.base import ServiceError, ServicesSettings
from shadow_ab.dev.services.kafka import LocalKafka, kafka_version_in_pom
from shadow_ab.dev.services.postgres import LocalPostgres
from shadow_ab.settings import services_env_file

Service = LocalPostgres | LocalKafka

ONLY = click.Choice(["postgres", "kafka"])


def _services(only: str | None) -> list[Service]:
    settings = ServicesSettings()
    every: list[Service] = [LocalPostgres(settings), LocalKafka(settings)]
    return [s for s in every if only is None or s.name == only]


def _env_lines() -> list[str]:
    env: dict[str, str] = {}
    for service in _services(None):
        env.update(service.env())
    return [f"export {k}={shlex.quote(v)}" for k, v in env.items()]


@click.group()
def services() -> None:
    """Local Kafka (KRaft, from Maven Central) and PostgreSQL (Debian), on loopback only."""


@services.command()
@click.option("--only", type=ONLY, help="Start just this service.")
def up(only: str | None) -> None:
    """Install what is missing, start, and wait until both accept connections (idempotent)."""
    for service in _services(only):
        started = time.monotonic()
        was_running = service.running()
        try:
            service.up()
        except ServiceError as exc:
            raise click.ClickException(f"{service.name}: {exc}") from exc
        verb = (
            "already running" if was_running else f"started in {time.monotonic() - started:.1f} s"
        )
        click.echo(f"{service.name}: {verb} at {service.status().address}", err=True)
    if only is None or only == "kafka":
        _ensure_topics()
    lines = _env_lines()
    env_file = services_env_file()
    env_file.parent.mkdir(parents=True, exist_ok=True)
    env_file.write_text("\n".join(line.removeprefix("export ") for line in lines) + "\n")
    click.echo(f"# connection settings (also in {env_file}):", err=True)
    click.echo("\n".join(lines))


def _ensure_topics() -> None:
    from shadow_ab.topics import ensure_topics

    bootstrap = LocalKafka(ServicesSettings()).bootstrap
    ensure_topics(bootstrap)


@services.command()
@click.option("--only", type=ONLY, help="Stop just this service.")
def down(only: str | None) -> None:
    """Stop the services (their data stays under var/services)."""
    for service in reversed(_services(only)):
        try:
            service.down()
        except ServiceError as exc:
            raise click.ClickException(f"{service.name}: {exc}") from exc
        click.echo(f"{service.name}: stopped", err=True)


@services.command()
def status() -> None:
    """Say what runs where; exit 1 if something is not running."""
    all_up = True
    for service in _services(None):
        st = service.status()
        all_up &= st.running
        extra = f" (Kafka {kafka_version_in_pom()})" if service.name == "kafka" else ""
        state = "running" if st.running else "down"
        click.echo(f"{st.name:<9} {state:<8} {st.address:<16} {st.detail}{extra}")
    if not all_up:
        raise SystemExit(1)


@services.command()
def env() -> None:
    """Print the connection settings as shell exports: eval "$(shadow-ab services env)"."""
    click.echo("\n".join(_env_lines()))
