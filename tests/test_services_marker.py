"""The `services` marker is put on exactly the tests that use Kafka or PostgreSQL, so that
`pytest -m "not services"` runs the rest without them (the hook in tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")

TESTS = """
import pytest


@pytest.fixture
def built_on_pg(pg_databases):
    return pg_databases


def test_plain(tmp_path):
    pass


def test_kafka(kafka_bootstrap):
    pass


def test_through_a_fixture(built_on_pg):
    pass


def test_migrated_copy(pg_url):
    pass


def test_sqlite_only(sqlite_engine):
    pass


def test_store(store):
    pass


@pytest.mark.parametrize("n", [1, 2])
def test_other_params(n, sqlite_url):
    pass
"""

MARKED = {
    "test_kafka",
    "test_through_a_fixture",
    "test_migrated_copy",
    "test_store[postgresql]",
}
UNMARKED = {
    "test_plain",
    "test_sqlite_only",
    "test_store[sqlite]",
    "test_other_params[1]",
    "test_other_params[2]",
}


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    """A suite under the real tests/conftest.py (collection only: no service is reached)."""
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    services: needs Kafka or PostgreSQL\n")
    pytester.makepyfile(test_suite=TESTS)
    return pytester


def test_tests_using_service_fixtures_are_marked(suite: pytest.Pytester) -> None:
    items, _ = suite.inline_genitems()
    marked = {i.name for i in items if i.get_closest_marker("services")}
    assert marked == MARKED
    assert {i.name for i in items} == MARKED | UNMARKED


def test_not_services_deselects_them(suite: pytest.Pytester) -> None:
    result = suite.runpytest("--collect-only", "-q", "-m", "not services")
    listed = {line.split("::", 1)[1] for line in result.outlines if "::" in line}
    assert listed == UNMARKED
    result.stdout.fnmatch_lines([f"{len(UNMARKED)}/{len(MARKED | UNMARKED)} tests collected*"])
