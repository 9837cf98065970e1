"""``shadow-ab sim``: run a simulated vLLM or TensorRT-LLM server."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import cast

import click

from shadow_ab.settings import state_dir
from simulator.scenario import Flavor, ScenarioError, load_scenario, shipped


@click.command(name="sim", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--flavor", type=click.Choice(["vllm", "trtllm"]), required=True)
@click.option("--port", type=click.IntRange(1, 65535), required=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option(
    "--config",
    "config",
    default=None,
    help="Scenario YAML file, or the name of a shipped one: " + ", ".join(shipped()) + ".",
)
@click.option(
    "--ledger",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="JSON-lines file of everything injected (default: var/sim/<flavor>-<port>.jsonl).",
)
@click.option("--no-ledger", is_flag=True, help="Write no ledger.")
@click.option(
    "--time-scale",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Simulated seconds per real second (overrides the scenario's time_scale).",
)
@click.option("--engine-name", default=None, help="Engine id written in the ledger.")
@click.option("--check", is_flag=True, help="Validate the scenario, print it resolved, exit.")
def sim(
    flavor: str,
    port: int,
    host: str,
    config: str | None,
    ledger: Path | None,
    no_ledger: bool,
    time_scale: float | None,
    engine_name: str | None,
    check: bool,
) -> None:
    """Run a simulated vLLM or TensorRT-LLM server (restarted after injected crashes)."""
    overrides = {} if time_scale is None else {"time_scale": time_scale}
    try:
        scenario = load_scenario(config, cast(Flavor, flavor), **overrides)
    except ScenarioError as exc:
        raise click.ClickException(str(exc)) from exc
    if check:
        click.echo(scenario.model_dump_json(indent=2))
        return
    if no_ledger:
        ledger = None
    elif ledger is None:
        ledger = state_dir() / "sim" / f"{flavor}-{port}.jsonl"
    from simulator.supervisor import Supervisor

    sys.exit(Supervisor(scenario, host=host, port=port, ledger=ledger, engine=engine_name).run())
