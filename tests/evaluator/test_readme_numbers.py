"""The plan's numbers that evaluator/README.md and the verdict benches' docstrings quote, against
what the policy and plan code compute: a README that quotes another policy's boundary (2.73 for
a FAIL at day 30, "1/13" of the budget, "/11") fails here, not in a reader's head."""

from __future__ import annotations

import re
from pathlib import Path

from scipy import stats

from evaluator.policy import default_policy

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "evaluator" / "README.md").read_text()


def _plan() -> tuple[int, str, str, str]:
    """The default policy's criteria, day-30 FAIL and PASS boundaries, and one look's boundary
    at the same per-criterion alpha (two decimals, as the README quotes them)."""
    policy = default_policy()
    last = policy.look(policy.horizon_days)
    one = float(stats.norm.isf(last.alpha))
    assert last.pass_z is not None
    return len(policy.criteria), f"{last.z:.2f}", f"{last.pass_z:.2f}", f"{one:.2f}"


def test_the_readme_quotes_the_default_plans_boundaries() -> None:
    k, fail, passing, one = _plan()
    assert f"the last look {fail} for the default policy's {k} criteria, against {one}" in (
        " ".join(README.split())
    )
    assert f"where a FAIL needs {fail}." in " ".join(README.split())
    assert f"pass at {passing} rather than {fail} standard errors at day 30" in README
    assert f"z_final = {fail} for the default policy's {k} criteria" in README
    assert f"each criterion now gets 1/{k} of `false_nogo`" in README
    # Every "a FAIL needs z" and every per-criterion share quoted outside a dated measurement
    # is the code's.
    for z in re.findall(r"a FAIL needs (\d\.\d+)", " ".join(README.split())):
        assert z == fail
    for share in re.findall(r"each criterion now gets 1/(\d+)", README):
        assert int(share) == k
    for n in re.findall(r"the default policy's (\d+) criteria", " ".join(README.split())):
        assert int(n) == k


def test_the_verdict_benches_quote_the_policys_share() -> None:
    k = len(default_policy().criteria)
    for path in ("shadow_ab/dev/verdict_months.py", "bench/verdict_validity.py"):
        text = (ROOT / path).read_text()
        assert "/11" not in text.replace("1/11 of", ""), path
        assert f": {k})" in text or f": 1/{k})" in text, path
