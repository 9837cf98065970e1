"""False NO-GO, power and GO over generated months looked at daily, old decision rule beside new.

    python bench/verdict_validity.py [--months 200] [--latency-months 24] [--leak-months 20]
                                     [--effect-months N] [--new-only] [--compare-pass]
                                     [--curve-months 100]
                                     [--groups latency,counts,leak]
                                     [--latency-pairs 40000]
                                     [--resamples 999] [--kinds independent,clustered]
                                     [--curve-latency-months 6] [--workers 2] [--quick]
                                     [--no-curves | --curves-only]

Generates months (``shadow_ab/dev/months.py`` for latency, errors, crashes and divergence;
``tests/evaluator/memory_months.py`` for memory: each module's docstring lists every assumption
its generator makes), independent or clustered, looks at each one on every day 1..30 with the
evaluator's own interval functions and verdict (``shadow_ab/dev/verdict_months.py``; memory:
``evaluator.incidents.leak.growth`` and ``excess_growth``, as ``compare_memory`` judges
``incidents.leak.excess_mb_per_hour``), and prints, per generator kind, scenario and row:

- ``NO-GO by d30``: months with a NO-GO at some look of days 1..30 (a criterion's row: its
  FAIL). A/A: the false NO-GO (target <= 5 %); a real effect, on its criterion and combined:
  the power (target >= 90 %);
- ``GO any look``: months with a GO (a criterion's row: its PASS) at some look. A real effect:
  the false GO (target <= 5 %, "GO at no look in >= 95 % of months"); A/A: how often identical
  engines can be signed off;
- ``GO at d30``: GO (PASS) at the horizon's look;
- ``ALERT``: months with an ALERT at some look (the new rule's early warning, never a NO-GO);

each as % of months with its Wilson 95 % interval (the binomial interval of that rate over the
months simulated), for the **old** rule (every look at 95 %, NO-GO on any FAIL from day 1,
``pass_if_zero`` on zero events) and the **new** one (the default policy: 30 daily looks,
false_nogo 0.05 split over its criteria (16 today), O'Brien-Fleming spending, min_days 3, zero
budgets, PASS on its own boundary of false_go 0.05 per criterion); with ``--compare-pass`` also
**norm**: the new rule with every interval restated at the PASS and ALERT levels by the normal
approximation and the zero budget held at the look's level (the rule before the counts'
intervals were recomputed at the PASS level by their own exact / score method), side by side
on the same months, and two more scenarios on the thresholds themselves (``errors@1.5``:
failures x1.5; ``crash@2``: crash episodes x2), whose ``GO any look`` is the false GO each
criterion's ``false_go`` (5 %) bounds. Each criterion is judged at
the level the shipped policy gives it (1/16 of the family-wise budget). Rows: ``ttft p95``,
``errors``, ``crash``, ``leak``, ``divergence``; ``all 5``: the five together on the months
that have all five (a scenario's effect on its criterion, A/A data on the others: the
criteria's data are drawn independently).

Then the **power curves**: crash 3x against the base rate of crash episodes, and TTFT p95
x1.12 against the engines' own day effect (sd 0-0.04, the review's sample): what a target needs.

The latency rows run the review's paired day/hour block bootstrap of the TTFT p95 ratio on
``--latency-pairs`` pairs (the review's sample: 40 000 pairs in all, drawn per hour) with
``--resamples`` resamples (999), its resamples drawn once per look and read at every level;
``--effect-months``: months of each real-effect scenario (default: its group's A/A months; power
needs fewer months than a bound on the false NO-GO); ``--new-only``: the new rule alone (the
old one's rows left out, about half the time of the count and memory months); ``--groups``:
only these groups' months (``latency``, ``counts``, ``leak``; the ``all 5`` rows need all
three).
``--quick``: a few months of each (seconds to a minute; for smoke tests).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from evaluator.incidents.leak import LeakParams, excess_growth, growth
from evaluator.policy import Policy, parse_policy
from evaluator.rates import wilson_interval
from evaluator.results import Interval, Measurement
from evaluator.review import data_measurements
from evaluator.verdict import Outcome, decide
from shadow_ab.dev.months import AA, AT_THRESHOLD, EFFECTS, MonthShape, generate
from shadow_ab.dev.verdict_months import Settings, look_month, old_decide, simulated_policy
from tests.evaluator.memory_months import MB, QUIET, MonthSpec
from tests.evaluator.memory_months import generate as generate_memory

DAYS = 30
COUNTS = ("errors.rate_ratio", "incidents.crash.rate_ratio", "divergence.hard_excess_rate")
LATENCY = ("latency.ttft.p95.ratio",)
LEAK = "incidents.leak.excess_mb_per_hour"
ROWS = {
    "latency.ttft.p95.ratio": "ttft p95",
    "errors.rate_ratio": "errors",
    "incidents.crash.rate_ratio": "crash",
    LEAK: "leak",
    "divergence.hard_excess_rate": "divergence",
}
SCENARIOS = ("A/A", "ttft", "crash", "leak", "divergence")
LEAK_MB_H = 50.0
"""The real leak: the candidate's memory grows 50 MB/h through every process life."""

# An outcome trace: per look (day 1..30), per criterion of its group, one letter.
LETTER = {Outcome.PASS: "P", Outcome.FAIL: "F", Outcome.INCONCLUSIVE: "I", Outcome.ALERT: "A"}


@dataclass(frozen=True)
class Job:
    group: str  # "latency", "counts" or "leak"
    kind: str
    scenario: str
    seed: int
    shape: MonthShape | None = None
    settings: Settings = field(default_factory=Settings)
    old: bool = True
    """Also judge the old rule (the curves do not)."""
    norm: bool = False
    """Also judge the new rule with PASS restated by the normal approximation (``norm``)."""


Traces = dict[str, list[str]]
"""rule -> per look, one letter per criterion of the group."""


def _policy(keys: tuple[str, ...]) -> Policy:
    return simulated_policy(keys=keys)


def leak_policy() -> Policy:
    """The default policy's leak criterion alone, with its share (1/K of K criteria: 1/16) of the
    budget."""
    base = simulated_policy(keys=("errors.rate_ratio",))  # one criterion's share of the plan
    crit = parse_policy({"criteria": [f"{LEAK} <= 20"]}).criteria
    return replace(base, criteria=crit)


def _memory_spec(kind: str) -> MonthSpec:
    """Independent: white noise alone (no restart, no refill, no daily cycle); clustered: AR(1)
    noise decaying over 15 min, a daily cycle of 30 MB, restarts with refills (the leak
    bench's month)."""
    if kind == "independent":
        return MonthSpec(days=float(DAYS), noise="white", **QUIET)  # type: ignore[arg-type]
    return MonthSpec(days=float(DAYS), daily_mb=30.0)


def _leak_traces(job: Job) -> Traces:
    spec = _memory_spec(job.kind)
    inc = generate_memory(spec, job.seed)
    cand = generate_memory(spec, job.seed + 100_000)
    y = cand.y
    if job.scenario == "leak":  # growth through every process life since its start
        idx = np.searchsorted(np.asarray(cand.starts), cand.t, side="right") - 1
        y = y + (cand.t - np.asarray(cand.starts)[idx]) / 3600.0 * LEAK_MB_H * MB
    policy = leak_policy()
    params = LeakParams()
    out: Traces = {"new": [], "old": []} if job.old else {"new": []}
    for day in range(1, DAYS + 1):
        i, c = inc.until(day), cand.until(day)
        keep = cand.t < cand.t[0] + day * 86400.0
        g_i = growth(i.t, i.y, i.starts, params)
        g_c = growth(c.t, y[keep], c.starts, params)
        levels = [("new", policy.look(float(day)).level), ("old", 0.95)][: 2 if job.old else 1]
        for rule, level in levels:
            if g_i is None or g_c is None:
                m = Measurement(LEAK, None, None, 0, "MB/hour")
            else:
                diff, low, high = excess_growth(g_c, g_i, level)
                m = Measurement(LEAK, diff, Interval(low, high, level), g_c.epochs, "MB/hour")
            ms = [m, *data_measurements({"pairs": 10**6, "days": float(day)})]
            if rule == "new":
                verdict = decide(policy, ms)
                out[rule].append("".join(LETTER[r.outcome] for r in verdict.results))
            else:
                _, outcomes = old_decide(policy, ms, day)
                out[rule].append("".join(LETTER[o] for o in outcomes))
    return out


def run(job: Job) -> tuple[Job, Traces]:
    if job.group == "leak":
        return job, _leak_traces(job)
    keys = LATENCY if job.group == "latency" else COUNTS
    if job.group == "crash":  # the crash criterion alone (the power curve)
        keys = ("incidents.crash.rate_ratio",)
    effects = EFFECTS.get(job.scenario) or AT_THRESHOLD.get(job.scenario, AA)
    shape = (job.shape or MonthShape(clustered=job.kind == "clustered")).with_effects(effects)
    traces = look_month(
        generate(shape, job.seed), _policy(keys), job.settings, old=job.old, norm=job.norm
    )
    return job, {
        rule: ["".join(LETTER[o] for o in look) for look in t.outcomes]
        for rule, t in traces.items()
    }


def _effect_group(scenario: str) -> str:
    return {
        "ttft": "latency",
        "crash": "counts",
        "divergence": "counts",
        "leak": "leak",
        "errors@1.5": "counts",
        "crash@2": "counts",
    }.get(scenario, "")


@dataclass
class Tally:
    months: int = 0
    nogo: int = 0
    go: int = 0
    go_last: int = 0
    alert: int = 0

    def add(self, looks: list[str], min_days: int = 3) -> None:
        """``looks``: per look, one letter per criterion judged together."""
        self.months += 1
        self.nogo += any("F" in x for x in looks)
        go = [set(x) == {"P"} and d + 1 >= min_days for d, x in enumerate(looks)]
        self.go += any(go)
        self.go_last += go[-1]
        self.alert += any("A" in x for x in looks)


def rate(k: int, n: int) -> str:
    iv = wilson_interval(k, n)
    if iv is None:
        return "n/a"
    return f"{100 * k / n:5.1f} [{100 * iv.low:4.1f}-{100 * iv.high:5.1f}]"


def _pool(workers: int) -> ProcessPoolExecutor | None:
    return ProcessPoolExecutor(workers) if workers > 1 else None


def run_all(jobs: list[Job], workers: int) -> dict[tuple[str, str, str, int], Traces]:
    """Every job's traces by (group, kind, scenario-or-A/A, seed); A/A data of a group is
    computed once and shared by every scenario that does not touch that group."""
    out: dict[tuple[str, str, str, int], Traces] = {}
    pool = _pool(workers)
    try:
        results: Iterable[tuple[Job, Traces]] = (
            pool.map(run, jobs, chunksize=1) if pool else map(run, jobs)
        )
        for job, traces in results:
            out[(job.group, job.kind, job.scenario, job.seed)] = traces
    finally:
        if pool:
            pool.shutdown()
    return out


def main_table(args: argparse.Namespace, kind: str, settings: Settings) -> list[str]:
    sizes = {"latency": args.latency_months, "counts": args.months, "leak": args.leak_months}
    sizes = {g: n for g, n in sizes.items() if g in args.groups.split(",")}

    def months(group: str, data: str) -> int:
        effect = data != "A/A" and args.effect_months is not None
        return int(args.effect_months) if effect else sizes[group]

    scenarios = (*SCENARIOS, *AT_THRESHOLD) if args.compare_pass else SCENARIOS
    jobs = []
    for group in sizes:
        for scenario in ("A/A", *(s for s in scenarios if _effect_group(s) == group)):
            n = months(group, scenario)
            jobs += [
                Job(
                    group,
                    kind,
                    scenario,
                    seed,
                    settings=settings,
                    old=not args.new_only,
                    norm=args.compare_pass and group != "leak",
                )
                for seed in range(n)
            ]
    started = time.perf_counter()
    traces = run_all(jobs, args.workers)
    keys = {"latency": LATENCY, "counts": COUNTS, "leak": (LEAK,)}
    lines = []
    for scenario in scenarios:
        data_of = {g: scenario if _effect_group(scenario) == g else "A/A" for g in sizes}
        both = min(months(g, d) for g, d in data_of.items())
        rules = ("new",) if args.new_only else ("old", "new")
        if args.compare_pass:
            rules = (*rules[:-1], "norm", "new")
        for rule in rules:
            rows: dict[str, Tally] = {}
            for group in sizes:
                data = data_of[group]
                for seed in range(months(group, data)):
                    both_rules = traces[(group, kind, data, seed)]
                    trace = both_rules.get(rule, both_rules["new"])
                    for i, key in enumerate(keys[group]):
                        rows.setdefault(ROWS[key], Tally()).add([x[i] for x in trace])
            combined = Tally()
            for seed in range(both):
                per = [traces[(g, kind, data_of[g], seed)] for g in sizes]
                # the leak's growth interval has no method of its own: its "norm" is "new"
                combined.add(["".join(p.get(rule, p["new"])[d] for p in per) for d in range(DAYS)])
            if len(sizes) == 3:
                rows["all 5"] = combined
            own = {"ttft": "ttft p95", "errors@1.5": "errors", "crash@2": "crash"}.get(
                scenario, scenario
            )
            for row, t in rows.items():
                if scenario == "A/A" or row in (own, "all 5"):
                    lines.append(_line(kind, scenario, row, rule, t))
    lines.append(f"({kind}: {time.perf_counter() - started:.0f} s)")
    return lines


HEADER = (
    f"{'kind':<12}{'scenario':<11}{'row':<11}{'rule':<5}{'months':>7}  "
    f"{'NO-GO by d30':<22}{'GO any look':<22}{'GO at d30':<22}{'ALERT':<20}"
)


def _line(kind: str, scenario: str, row: str, rule: str, t: Tally) -> str:
    alert = rate(t.alert, t.months) if rule != "old" else ""
    return (
        f"{kind:<12}{scenario:<11}{row:<11}{rule:<5}{t.months:>7}  {rate(t.nogo, t.months):<22}"
        f"{rate(t.go, t.months):<22}{rate(t.go_last, t.months):<22}{alert:<20}"
    )


def curves(args: argparse.Namespace, settings: Settings) -> list[str]:
    """Power against what the data holds: crash episodes per day; latency sample and day
    effects. New rule only; the effect's own criterion alone."""
    lines = [
        "",
        "power curves (new rule; the effect's criterion alone; % of months [Wilson 95 %]):",
        f"{'effect':<13}{'generator':<44}{'months':>7}  {'NO-GO by d30':<22}{'GO any look':<22}"
        f"{'A/A: GO at d30':<22}",
    ]
    jobs: list[Job] = []
    specs: list[tuple[str, str, str, MonthShape, Settings, int]] = []
    base_loop = 1 + sum(MonthShape().loop_restarts) / 2  # restarts per clustered episode
    for episodes in (0.1, 1.0, 3.0, 10.0):
        shape = MonthShape(clustered=True, crashes_per_day=episodes * base_loop)
        specs.append(
            ("crash x3", f"clustered, {episodes:g} episodes/day", "crash", shape, settings, 0)
        )
    for restarts in (0.75, 10.0):
        shape = MonthShape(clustered=False, crashes_per_day=restarts)
        specs.append(
            ("crash x3", f"independent, {restarts:g} crashes/day", "crash", shape, settings, 0)
        )
    lat_months = args.curve_latency_months
    # The review's own sample; the clustered generator's hour effects, its day effect varied:
    # where the 90 % power target stops being reachable (the day effect, not the sample).
    pairs = settings.latency_pairs
    lat_shapes = [("independent", MonthShape(clustered=False))] + [
        (f"clustered, engine day sd {sd:g}", MonthShape(clustered=True, engine_day_sd=sd))
        for sd in (0.0, 0.01, 0.02, 0.04)
    ]
    for what, shape in lat_shapes if lat_months > 0 else []:
        specs.append(("ttft x1.12", f"{what}, {pairs} pairs", "latency", shape, settings, 0))
    for i, (effect, _label, group, shape, sized, _) in enumerate(specs):
        n = args.curve_months if group == "crash" else lat_months
        scenario = "crash" if effect.startswith("crash") else "ttft"
        for seed in range(n):
            jobs.append(Job(group, f"curve{i}", scenario, seed, shape, sized, old=False))
            jobs.append(Job(group, f"curve{i}", "A/A", seed, shape, sized, old=False))
    started = time.perf_counter()
    traces = run_all(jobs, args.workers)
    for i, (effect, label, group, _, _, col) in enumerate(specs):
        n = args.curve_months if group == "crash" else lat_months
        scenario = "crash" if effect.startswith("crash") else "ttft"
        real, aa = Tally(), Tally()
        for seed in range(n):
            real.add([x[col] for x in traces[(group, f"curve{i}", scenario, seed)]["new"]])
            aa.add([x[col] for x in traces[(group, f"curve{i}", "A/A", seed)]["new"]])
        lines.append(
            f"{effect:<13}{label:<44}{n:>7}  {rate(real.nogo, n):<22}{rate(real.go, n):<22}"
            f"{rate(aa.go_last, n):<22}"
        )
    lines.append(f"(curves: {time.perf_counter() - started:.0f} s)")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--months", type=int, default=200, help="months per scenario, counts")
    ap.add_argument("--latency-months", type=int, default=24, help="months with the latency")
    ap.add_argument("--leak-months", type=int, default=20, help="months with memory")
    ap.add_argument("--curve-months", type=int, default=100, help="months per crash curve point")
    ap.add_argument(
        "--curve-latency-months", type=int, default=6, help="months per TTFT curve point (0: none)"
    )
    ap.add_argument("--effect-months", type=int, default=None, help="months per real effect")
    ap.add_argument("--new-only", action="store_true", help="the new rule alone")
    ap.add_argument(
        "--compare-pass",
        action="store_true",
        help="also the new rule with the PASS level restated by the normal approximation"
        " (rows 'norm': the rule before the exact / score restatement)",
    )
    ap.add_argument("--groups", default="latency,counts,leak", help="which groups' months")
    ap.add_argument("--latency-pairs", type=int, default=Settings().latency_pairs)
    ap.add_argument("--resamples", type=int, default=999)
    ap.add_argument("--kinds", default="independent,clustered")
    ap.add_argument("--workers", type=int, default=2, help="processes (the machine's cores)")
    ap.add_argument("--no-curves", action="store_true", help="skip the power curves")
    ap.add_argument("--curves-only", action="store_true", help="only the power curves")
    ap.add_argument("--quick", action="store_true", help="a few months of each (smoke test)")
    args = ap.parse_args()
    if args.quick:
        args.months, args.latency_months, args.leak_months, args.curve_months = 6, 2, 2, 6
        args.latency_pairs, args.resamples, args.curve_latency_months = 2000, 199, 1
    settings = Settings(latency_pairs=args.latency_pairs, resamples=args.resamples)
    print(
        f"months: {args.months} (errors, crash, divergence), {args.latency_months} (latency:"
        f" {args.latency_pairs} pairs, {args.resamples} resamples), {args.leak_months} (memory),"
        f" {args.curve_months} / {args.curve_latency_months} per crash / TTFT curve point;"
        f" {DAYS} daily looks each; rates in % of months [Wilson 95 % interval]"
    )
    for kind in [] if args.curves_only else args.kinds.split(","):
        print(f"\n{HEADER}")
        for line in main_table(args, kind, settings):
            print(line, flush=True)
    if not args.no_curves:
        for line in curves(args, settings):
            print(line, flush=True)


if __name__ == "__main__":
    main()
