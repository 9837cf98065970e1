"""``shadow-ab incidents`` with click's CliRunner on a SQLite store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from test_incidents_store import DEP, exchanges, health_samples

from shadow_ab.cli import main
from storage.db import make_engine
from storage.migrate import upgrade
from storage.write import write_exchanges, write_health


@pytest.fixture(scope="module")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A SQLite store with 12 h of a leaking, once-crashing candidate (nothing detected yet)."""
    path: Path = tmp_path_factory.mktemp("cli") / "store.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    engine = make_engine(url)
    write_health(engine, health_samples())
    write_exchanges(engine, exchanges())
    engine.dispose()
    yield url


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["incidents", *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_detect_then_table_and_json(store_url: str) -> None:
    code, out, _ = run("-d", DEP, "--database-url", store_url)
    assert code == 0
    assert "no incidents stored" in out and "--detect" in out

    code, out, _ = run("-d", DEP, "--database-url", store_url, "--detect", "--by", "day")
    assert code == 0, out
    assert "detected 2 incidents" in out and "(2 new)" in out
    lines = out.splitlines()
    crash = next(line for line in lines if " crash " in line)
    assert "candidate" in crash and "trtllm@candidate" in crash and "1 connection errors" in crash
    leak = next(line for line in lines if " leak " in line)
    assert "MB/h" in leak and "gpu_mem_bytes" in leak
    assert any(line.startswith("2026-11-30  0 ") for line in lines)  # the per-day row
    assert "rate ratio candidate/incumbent: inf" in out
    assert all(line == line.rstrip() for line in lines)

    code, out, _ = run("-d", DEP, "--database-url", store_url, "--detect")
    assert "(0 new)" in out  # idempotent

    code, out, _ = run(
        "-d", DEP, "--database-url", store_url, "--kind", "crash", "--format", "json"
    )
    assert code == 0
    doc = orjson.loads(out)
    assert [r["kind"] for r in doc["incidents"]] == ["crash"]
    assert doc["comparison"]["roles"]["candidate"]["counts"] == {"crash": 1}
    assert doc["comparison"]["comparison"]["interval"]["high"] is None  # unbounded, strict JSON

    code, out, _ = run(
        "-d", DEP, "--database-url", store_url, "--engine", "incumbent", "--format", "json"
    )
    assert orjson.loads(out)["incidents"] == []
    code, out, _ = run(
        "-d", DEP, "--database-url", store_url, "--since", "2026-11-30T12:00Z", "--by", "week"
    )
    rows = [line for line in out.splitlines() if "trtllm@candidate" in line]
    assert len(rows) == 1 and " crash " in rows[0] and "2026-W49" in out


def test_errors_say_what_to_do(store_url: str) -> None:
    code, _, err = run("-d", "nope", "--database-url", store_url)
    assert code == 2 and f"known deployments: {DEP}" in err
    code, _, err = run("-d", DEP, "--database-url", store_url, "--since", "yesterday")
    assert code == 2 and "ISO 8601" in err
    code, _, err = run("-d", DEP, "--database-url", store_url, "--kind", "meltdown")
    assert code == 2 and "crash" in err
    code, _, err = run(
        "-d", DEP, "--database-url", store_url, "--since", "2026-12-01", "--until", "2026-11-30"
    )
    assert code == 2 and "after --since" in err
