"""Issue 14's proof, in quick mode: each fault or attack of bench/chaos.py against a real mirror
subprocess, asserting the targets -- no record lost uncounted, recovery without a hand, memory
bounded -- and, for the secrets, that none reached where it must not. No timing is asserted.

Which test reproduces which numbered finding: README.md in this folder."""

from __future__ import annotations

import os
import resource

import chaos
import pytest

# A 1 GiB pod is what the attacks exhausted; the mirror idles near 110 MB.
RSS_BOUND_MB = 512


@pytest.fixture(autouse=True, scope="module")
def _many_files() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))


def assert_targets(row: chaos.Row, errors: int = 0) -> None:
    print(chaos.table([row]))
    assert row.lost == 0, row
    assert row.recovered, row
    assert row.errors == errors, row
    assert row.peak_rss_mb < RSS_BOUND_MB, row


@pytest.mark.parametrize(
    "scenario",
    ["too_large", "poison"],
    ids=[
        "finding 1: a record too large for Kafka fails alone",
        "finding 3: a year-9999 record is one dead letter, the rest stored",
    ],
)
def test_findings_1_and_3_one_bad_record_fails_alone(
    ctx: chaos.Ctx, kafka_bootstrap: str, scenario: str
) -> None:
    ctx.kafka = kafka_bootstrap
    row = chaos.SCENARIOS[scenario](ctx)
    assert_targets(row)
    assert row.dropped == 1  # counted once (too_large; one dead letter, not one per restart)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_finding_2_a_full_disk_is_back_pressure_and_recovers(ctx: chaos.Ctx) -> None:
    row = chaos.disk_full(ctx)
    assert_targets(row)
    assert row.dropped > 0  # the disk did fill: counted spool_full


def test_finding_4_sigkill_loses_nothing_uncounted(ctx: chaos.Ctx) -> None:
    row = chaos.sigkill(ctx)
    assert_targets(row)
    assert row.dropped > 0  # records were queued when it died: counted killed


def test_finding_4_sigterm_with_kafka_away_loses_nothing(ctx: chaos.Ctx) -> None:
    row = chaos.sigterm(ctx)
    assert_targets(row)
    assert row.dropped == 0


def test_finding_7_hostile_api_queries_are_small_422_problems(ctx: chaos.Ctx) -> None:
    row = chaos.api_range(ctx)
    assert_targets(row)
    assert "answers [422]" in row.notes, row
    assert "9/9 problem+json" in row.notes, row


@pytest.mark.parametrize("scenario", ["header_flood", "slow_headers", "idle"])
def test_finding_6_hostile_connections_cost_bounded_memory(ctx: chaos.Ctx, scenario: str) -> None:
    row = chaos.SCENARIOS[scenario](ctx)
    assert_targets(row)
    if scenario == "header_flood":
        assert "431" in row.notes, row
    else:
        assert row.notes.startswith("0/"), row  # every attacking connection was closed


def test_finding_8_no_client_credential_reaches_the_candidate(ctx: chaos.Ctx) -> None:
    row = chaos.credentials(ctx)
    assert_targets(row)
    assert "reached the candidate: n" in row.notes


def test_finding_9_a_url_password_is_in_no_502_and_no_log(ctx: chaos.Ctx) -> None:
    row = chaos.url_password(ctx)
    assert_targets(row, errors=row.errors)
    assert row.errors == int(row.requests)  # 502s: the incumbent is down
    assert "in the log: n" in row.notes
