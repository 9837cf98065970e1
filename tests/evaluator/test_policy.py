"""The policy file: shorthand and mapping criteria, validation errors that say what to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluator.policy import (
    PolicyError,
    default_policy,
    known_key,
    load_policy,
    parse_criterion,
    parse_policy,
)


def test_default_policy_loads_and_covers_kayentas_blind_spots() -> None:
    policy = default_policy()
    keys = {c.key for c in policy.criteria}
    assert "latency.e2e.spread_ratio" in keys  # variance increase with the same median
    assert "errors.rate_ratio" in keys  # sparse error counts, judged on an exact interval
    # Quality, not token identity: hard (non-near-tie) divergence, finish and length are
    # judged; the exact-match excess is information (a change of kernels flips near ties).
    assert "divergence.excess_rate" not in keys
    assert {"divergence.hard_excess_rate", "divergence.finish_mismatch.excess"} <= keys
    assert "divergence.length_shift" in keys
    assert policy.min_pairs > 0 and policy.min_days > 0
    assert load_policy(None) == policy == load_policy("default")


def test_shorthand_and_mapping_forms() -> None:
    c = parse_criterion("latency.ttft.p95.ratio <= 1.10", "t")
    assert (c.key, c.op, c.threshold) == ("latency.ttft.p95.ratio", "<=", 1.10)
    m = parse_criterion(
        {"key": "latency.goodput.delta", "op": ">=", "threshold": -0.05, "min_n": 50}, "t"
    )
    assert (m.op, m.threshold, m.min_n) == (">=", -0.05, 50)
    assert m.good(0.0) and not m.good(-0.1)


def test_load_from_file(tmp_path: Path) -> None:
    path = tmp_path / "strict.yaml"
    path.write_text(
        "name: strict\nmin_pairs: 10\nmin_days: 0.5\ncriteria:\n"
        "  - divergence.excess_rate <= 0.01\n"
        "  - {key: errors.rate_ratio, op: '<=', threshold: 1.2, pass_if_zero: true}\n"
    )
    policy = load_policy(path)
    assert policy.name == "strict" and policy.min_pairs == 10 and policy.min_days == 0.5
    assert [c.key for c in policy.criteria] == ["divergence.excess_rate", "errors.rate_ratio"]
    assert policy.criteria[1].pass_if_zero
    assert policy.source == str(path)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"criteria": ["latency.ttft.p95.ratoi <= 1.1"]}, "Did you mean latency.ttft.p95.ratio"),
        ({"criteria": ["latency.ttft.p95.ratio < 1.1"]}, "use '<='"),
        ({"criteria": ["latency.ttft.p95.ratio <= fast"]}, "threshold must be a number"),
        ({"criteria": [{"key": "errors.rate_ratio", "op": "<="}]}, "missing threshold"),
        ({"criteria": [{"key": "errors.rate_ratio", "op": "<=", "threshold": 1, "x": 1}]}, "x"),
        ({"criteria": []}, "non-empty list"),
        ({"criteria": ["errors.rate_ratio <= 1", "errors.rate_ratio <= 2"]}, "appears twice"),
        ({"criteria": ["errors.rate_ratio <= 1"], "min_pairs": -1}, "min_pairs"),
        ({"criteria": ["errors.rate_ratio <= 1"], "min_days": "a week"}, "min_days"),
        ({"criteria": ["errors.rate_ratio <= 1"], "thresholds": 1}, "unknown field"),
        (["errors.rate_ratio <= 1"], "a policy is a mapping"),
        ({"criteria": ["errors.rate_ratio <= 1"], "near_tie_nats": -0.5}, "between 0 and 20"),
        ({"criteria": ["errors.rate_ratio <= 1"], "near_tie_nats": 50}, "near_tie_nats"),
        ({"criteria": ["errors.rate_ratio <= 1"], "near_tie_nats": "half"}, "must be a number"),
    ],
)
def test_errors_say_what_to_fix(raw: object, expected: str) -> None:
    with pytest.raises(PolicyError, match=expected):
        parse_policy(raw, "p.yaml")


def test_error_names_the_criterion() -> None:
    with pytest.raises(PolicyError, match=r"p.yaml: criterion 2"):
        parse_policy({"criteria": ["errors.rate_ratio <= 1", "nope <= 1"]}, "p.yaml")


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="not found"):
        load_policy(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("criteria: [unclosed\n")
    with pytest.raises(PolicyError, match="not valid YAML"):
        load_policy(bad)


def test_known_keys() -> None:
    for key in (
        "latency.tokens_per_s.p50.ratio",
        "latency.itl.rank_test_p",
        "incidents.version_change.rate_ratio",
        "incidents.leak.candidate_mb_per_hour",
        "divergence.json_invalid.excess",
        "data.days",
    ):
        assert known_key(key), key
    for key in ("latency.ttft.p90.ratio", "incidents.oom.rate_ratio", "divergence.rate"):
        assert not known_key(key), key


def test_a_stored_policy_reads_back() -> None:
    """deployments.policy holds Policy.to_dict(); `shadow-ab report` parses it again."""
    policy = default_policy().with_minimums(min_days=0, note="demo: minimum days waived")
    again = parse_policy(policy.to_dict(), "deployments.policy")
    assert again.criteria == policy.criteria
    assert (again.min_pairs, again.min_days, again.notes) == (1000, 0, policy.notes)


def test_near_tie_nats_is_a_policy_field() -> None:
    """The near-tie margin is the policy's (the default says 0.5); a stored policy keeps it, a
    policy without one leaves it to the analysis (None)."""
    assert default_policy().near_tie_nats == 0.5
    own = parse_policy({"criteria": ["errors.rate_ratio <= 1"], "near_tie_nats": 0.25}, "p")
    assert own.near_tie_nats == 0.25
    assert parse_policy(own.to_dict(), "stored").near_tie_nats == 0.25
    assert parse_policy({"criteria": ["errors.rate_ratio <= 1"]}, "p").near_tie_nats is None
