"""The one command, ``shadow-ab``, with a subcommand per part.

Each part owns its subcommand in its own ``cli`` module; this file only maps names to them and
imports a part when its subcommand runs, so ``shadow-ab services up`` does not pay for FastAPI.
"""

from __future__ import annotations

import importlib

import click

from shadow_ab import __version__

# name -> "module:attribute" of a click command or group
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "services": (
        "shadow_ab.dev.services.cli:services",
        "Local Kafka and PostgreSQL for development.",
    ),
    "db": ("storage.cli:db", "Migrate the store and manage its partitions."),
    "ingest": ("ingester.cli:ingest", "Consume Kafka records into the store."),
    "sim": ("simulator.cli:sim", "Run a simulated vLLM or TensorRT-LLM server."),
    "mirror": ("mirror.cli:mirror", "Serve the incumbent and mirror traffic to the candidate."),
    "report": ("evaluator.report_cli:report", "Review a deployment and write the go/no-go report."),
    "incidents": ("evaluator.incidents.cli:incidents", "List and compare engine incidents."),
    "api": ("api.cli:api", "Serve the read-only query API."),
    "demo": ("shadow_ab.dev.demo:demo", "Run a shadow deployment on simulators and report on it."),
    "engine": (
        "shadow_ab.dev.engines.cli:engine",
        "Real engines here: vLLM's CPU build, trtllm-serve's HTTP layer.",
    ),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = SUBCOMMANDS.get(cmd_name)
        if entry is None:
            return None
        target = entry[0]
        module_name, _, attr = target.partition(":")
        command = getattr(importlib.import_module(module_name), attr)
        if not isinstance(command, click.Command):
            raise TypeError(f"{target} is not a click command")
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Listing help must not import every part; the short help lives in SUBCOMMANDS.
        rows = [(name, SUBCOMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="shadow-ab")
def main() -> None:
    """Shadow-traffic A/B evaluation for LLM serving engines."""
    from shadow_ab.privacy import install_log_redaction

    install_log_redaction()  # no URL password in any command's log
