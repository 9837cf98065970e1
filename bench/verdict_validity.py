"""False NO-GO, power and GO-at-any-look over generated months looked at daily, old rule beside new.

    python bench/verdict_validity.py [--months 300] [--latency-months 20]
                                     [--latency-pairs 2000] [--resamples 199]
                                     [--kinds independent,clustered] [--quick]

Generates months with ``shadow_ab/dev/months.py`` (independent, or clustered: error bursts,
crash-loop episodes, engine-specific hour and day latency effects, a replay noise floor that
varies by day and sits low; its module docstring lists every assumption), looks at each one on
every day 1..30 with the evaluator's own interval functions and verdict
(``shadow_ab/dev/verdict_months.py``), and prints per generator kind, scenario and criterion:

- ``NO-GO``: the share of months with a NO-GO at some look (a criterion's FAIL at some look
  for a criterion's row). For A/A months it is the false NO-GO rate (target <= 5 %); for a real
  effect, on the criterion the effect is on and combined, the power by day 30 (target >= 90 %);
- ``GO/PASS``: the share of months with a GO at some look (a criterion's PASS at some look):
  for a real effect the false GO rate (target: GO at no look in >= 95 %, i.e. <= 5 %);
- ``ALERT``: months with an ALERT at some look (the new rule's early warning, never a NO-GO);

each with its Wilson 95 % interval, for the **old** rule (every look at 95 %, NO-GO on any FAIL
from day 1, ``pass_if_zero`` on zero events) and the **new** one (the default policy's plan:
30 daily looks, false_nogo 0.05 over its 11 criteria, O'Brien-Fleming spending, min_days 3,
zero budgets). The criteria are judged at the level the shipped policy gives them (their share
of the family-wise budget is the default policy's 1/11 each).

The latency criterion costs a bootstrap per look and rule, so it runs on the first
``--latency-months`` seeds with a smaller sample than the review (``--latency-pairs`` pairs,
``--resamples`` resamples; the review takes 10 000 and 999: an interval from fewer pairs is
wider, so power here is below the review's, and a percentile bootstrap of B resamples cannot
reach levels beyond about 1 - 2 / (B + 1): early looks get an interval narrower than asked for).
The count criteria (errors, crashes, divergence) run on ``--months`` seeds. The combined rows:
``3 counts`` over the count criteria on every month; ``all 4`` on the latency months, where the
same seeds give the same months for both. The intervals are whatever the evaluator's functions
compute today: when the analyses change (cluster bootstrap, crash episodes, overdispersion),
rerun this bench.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evaluator.rates import wilson_interval
from evaluator.verdict import Outcome
from shadow_ab.dev.months import AA, EFFECTS, MonthShape, generate
from shadow_ab.dev.verdict_months import Settings, Trace, look_month, simulated_policy

COUNTS = ("errors.rate_ratio", "incidents.crash.rate_ratio", "divergence.excess_rate")
LATENCY = ("latency.ttft.p95.ratio",)
SCENARIOS = {"counts": ("A/A", "crash", "divergence"), "latency": ("A/A", "ttft")}
SHORT = {
    "latency.ttft.p95.ratio": "ttft p95",
    "errors.rate_ratio": "errors",
    "incidents.crash.rate_ratio": "crash",
    "divergence.excess_rate": "divergence",
}


@dataclass
class Tally:
    months: int = 0
    nogo: int = 0
    go: int = 0
    alert: int = 0

    def add(self, nogo: bool, go: bool, alert: bool) -> None:
        self.months += 1
        self.nogo += nogo
        self.go += go
        self.alert += alert


def rate(k: int, n: int) -> str:
    iv = wilson_interval(k, n)
    if iv is None:
        return "n/a"
    return f"{100 * k / n:5.1f} [{100 * iv.low:4.1f}-{100 * iv.high:5.1f}]"


def combine(traces: list[Trace], day: int) -> tuple[bool, bool, bool]:
    """NO-GO / GO / ALERT of several criteria sets' traces at one look, judged together."""
    outcomes = [o for t in traces for o in t.outcomes[day]]
    nogo = Outcome.FAIL in outcomes
    go = all(o is Outcome.PASS for o in outcomes) and day + 1 >= 3
    return nogo, go, Outcome.ALERT in outcomes


def run_kind(
    kind: str, months: int, latency_months: int, settings: Settings
) -> dict[tuple[str, str, str], Tally]:
    """Tallies by (scenario, row, rule)."""
    shape0 = MonthShape(clustered=kind == "clustered")
    out: dict[tuple[str, str, str], Tally] = {}

    def tally(scenario: str, row: str, rule: str) -> Tally:
        return out.setdefault((scenario, row, rule), Tally())

    saved: dict[tuple[str, str, int], dict[str, Trace]] = {}
    for group, keys, n in (
        ("latency", LATENCY, latency_months),
        ("counts", COUNTS, months),
    ):
        policy = simulated_policy(keys=keys)
        for scenario in SCENARIOS[group]:
            effects = AA if scenario == "A/A" else EFFECTS[scenario]
            for seed in range(n):
                month = generate(shape0.with_effects(effects), seed)
                traces = look_month(month, policy, settings)
                if seed < latency_months:
                    saved[(group, scenario, seed)] = traces
                for rule, t in traces.items():
                    for i, c in enumerate(policy.criteria):
                        tally(scenario, SHORT[c.key], rule).add(
                            t.failed(i), t.passed(i), t.alerted(i)
                        )
                    if group == "counts":
                        alerted = any(t.alerted(i) for i in range(len(policy.criteria)))
                        tally(scenario, "3 counts", rule).add(t.nogo(), t.go(), alerted)
    # All four criteria together: a scenario's effect on its criteria, A/A data on the others
    # (the criteria's data are drawn independently, so pairing months of one seed is a month).
    for scenario in ("A/A", "ttft", "crash", "divergence"):
        for seed in range(latency_months):
            lat = saved[("latency", scenario if scenario == "ttft" else "A/A", seed)]
            cnt = saved[("counts", "A/A" if scenario == "ttft" else scenario, seed)]
            for rule in lat:
                looks = [combine([lat[rule], cnt[rule]], d) for d in range(30)]
                tally(scenario, "all 4", rule).add(
                    any(x[0] for x in looks), any(x[1] for x in looks), any(x[2] for x in looks)
                )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--months", type=int, default=300, help="months per scenario, counts")
    ap.add_argument("--latency-months", type=int, default=20, help="months with the latency")
    ap.add_argument("--latency-pairs", type=int, default=2000)
    ap.add_argument("--resamples", type=int, default=199)
    ap.add_argument("--kinds", default="independent,clustered")
    ap.add_argument("--quick", action="store_true", help="a few months (for tests)")
    args = ap.parse_args()
    if args.quick:
        args.months, args.latency_months = 10, 2
        args.latency_pairs, args.resamples = 500, 99
    settings = Settings(latency_pairs=args.latency_pairs, resamples=args.resamples)
    print(
        f"months: {args.months} (count criteria), {args.latency_months} (latency:"
        f" {args.latency_pairs} pairs, {args.resamples} resamples); 30 daily looks each;"
        " rates in % [Wilson 95 % interval]"
    )
    header = (
        f"{'kind':<12}{'scenario':<11}{'row':<11}{'rule':<5}{'months':>7}"
        f"  {'NO-GO at some look':<22}{'GO/PASS at some look':<22}{'ALERT at some look':<20}"
    )
    for kind in args.kinds.split(","):
        started = time.perf_counter()
        tallies = run_kind(kind, args.months, args.latency_months, settings)
        print(f"\n{header}")
        order = ["A/A", "ttft", "crash", "divergence"]
        rows = ["ttft p95", "errors", "crash", "divergence", "3 counts", "all 4"]
        for (scenario, row, rule), t in sorted(
            tallies.items(),
            key=lambda kv: (order.index(kv[0][0]), rows.index(kv[0][1]), kv[0][2] != "old"),
        ):
            alert = rate(t.alert, t.months) if rule == "new" else ""
            print(
                f"{kind:<12}{scenario:<11}{row:<11}{rule:<5}{t.months:>7}  "
                f"{rate(t.nogo, t.months):<22}{rate(t.go, t.months):<22}{alert:<20}"
            )
        print(f"({kind}: {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
