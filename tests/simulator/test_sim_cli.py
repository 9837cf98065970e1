"""``shadow-ab sim`` on the command line: validation before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from shadow_ab.cli import main


def test_sim_is_a_shadow_ab_subcommand() -> None:
    result = CliRunner().invoke(main, ["sim", "--help"])
    assert result.exit_code == 0
    assert "--flavor [vllm|trtllm]" in result.output
    assert "fast-crashy" in result.output  # shipped scenarios are listed


def test_check_prints_the_resolved_scenario() -> None:
    result = CliRunner().invoke(
        main,
        [
            "sim",
            "--flavor",
            "trtllm",
            "--port",
            "1",
            "--config",
            "leaky",
            "--time-scale",
            "60",
            "--check",
        ],
    )
    assert result.exit_code == 0, result.output
    resolved = json.loads(result.output)
    assert resolved["flavor"] == "trtllm" and resolved["name"] == "leaky"
    assert resolved["time_scale"] == 60.0
    assert resolved["faults"][0]["kind"] == "leak"


def test_bad_scenario_is_refused_with_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "s.yaml"
    bad.write_text("divergence:\n  q: 0.1\n")
    result = CliRunner().invoke(
        main, ["sim", "--flavor", "vllm", "--port", "1", "--config", str(bad)]
    )
    assert result.exit_code != 0
    assert "divergence.q: unknown key; allowed here: ['near_tie_share', 'p'" in result.output


def test_flavor_and_port_are_required() -> None:
    result = CliRunner().invoke(main, ["sim", "--port", "1"])
    assert result.exit_code == 2 and "--flavor" in result.output
