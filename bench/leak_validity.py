"""False leaks and found leaks over generated months of memory, old rule beside new.

    python bench/leak_validity.py [--months 100] [--old-months 30] [--kinds white,ar1,...]

Generates months of one engine's memory series with tests/evaluator/memory_months.py (restarts
isolated, two hours apart and faster than a scrape, memory refilling after every start; noise
white or AR(1) with sd 50 MiB decaying over 15 minutes; optionally a daily cycle; its module
docstring lists every assumption), looks at each month on days 3, 5, 7, 10, 14, 21 and 30 (the
window from its start to that day) and prints, per noise kind:

1. false leaks per 100 series-months at each look, and at any look, for the old rule (2 h
   Theil-Sen windows, Sen's interval, runs joined across restarts, a window's bonus for a run
   still going at the end; a frozen copy below) and the new one
   (``evaluator.incidents.leak.find_leaks`` with ``IncidentConfig()``'s parameters);
2. for months with one real leak of 50 MB/h over 6 hours (ending by day 2.5): the share of
   months where it is found at each look, the share of looks where its rate is within 20 %,
   the median rate error, and false leaks elsewhere in those months.

The old rule runs on the first ``--old-months`` months only (it costs ~1 s a look; it is given
the restarts, as the review gave it); the new rule on all ``--months``. Pure functions, no
store: a month is what the loader would hand detection (2-minute bin means).
"""

from __future__ import annotations

import argparse
import bisect
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "evaluator"))

from memory_months import (  # type: ignore[import-not-found]  # tests/evaluator, on sys.path above
    DAY_S,
    LOOK_DAYS,
    QUIET,
    Look,
    Month,
    MonthSpec,
    generate,
    leak_month,
    looks,
)

from evaluator.incidents.leak import Slope, binned, find_leaks, split_at, theil_sen
from evaluator.incidents.model import IncidentConfig

KINDS = {
    "white-quiet": MonthSpec(noise="white", **QUIET),
    "ar1-quiet": MonthSpec(noise="ar1", **QUIET),
    "white": MonthSpec(noise="white"),
    "ar1": MonthSpec(noise="ar1"),
    "ar1+daily30": MonthSpec(noise="ar1", daily_mb=30.0),
    "ar1+daily60": MonthSpec(noise="ar1", daily_mb=60.0),
}
"""Noise kinds. ``-quiet``: the noise alone (no restart, no refill: the old rule's false leaks
from autocorrelation alone); the others have restarts and refills. White: independent per
2-minute bin, sd 50 MiB; AR(1): sd 50 MiB, decaying over 15 minutes; ``+dailyN``: with a daily
cycle of +-N MiB (30: steepest 7.9 MB/h; 60: steepest 15.7 MB/h, 79 % of the threshold, where
a detector that looks at one engine cannot tell the cycle from growth)."""

LEAK_MB_H, LEAK_HOURS = 50.0, 6.0
NEW = IncidentConfig().leak_params


def new_rule(month: Month) -> list[tuple[float, float, float]]:
    leaks = find_leaks(month.t, month.y, month.starts, NEW)
    return [(lk.start, lk.end, lk.rate.mb_per_hour) for lk in leaks]


# The old rule, as evaluator/incidents/leak.py had it up to commit 00c4cde: 2 h
# windows stepping 15 min, Sen's interval, the lower bound above 20 MB/h over 3 h of window
# starts, runs split by a restart joined, a whole window added to a run still going at the end.


@dataclass(frozen=True)
class OldParams:
    window_s: float = 2 * 3600.0
    step_s: float = 15 * 60.0
    threshold_mb_h: float = 20.0
    sustain_s: float = 3 * 3600.0
    bin_s: float = 120.0
    min_points: int = 10
    min_coverage: float = 0.8
    level: float = 0.95


OLD = OldParams()
Window = tuple[int, float, Slope]


def old_windows(t: np.ndarray, y: np.ndarray, restarts: list[float], since: float) -> list[Window]:
    """The old ``window_slopes`` (windows starting at ``since`` or later); piece = restarts
    before the window's start."""
    out: list[Window] = []
    w, step = OLD.window_s, OLD.step_s
    for lo, hi, i, j in split_at(t, restarts):
        tb, yb = binned(t[i:j], y[i:j], OLD.bin_s)
        if len(tb) < OLD.min_points:
            continue
        need = OLD.min_coverage * w
        g = math.ceil(max(lo, float(tb[0]) - (w - need)) / step) * step
        while g + need <= tb[-1] and g + w <= hi:
            if g >= since:
                a = int(np.searchsorted(tb, g, side="left"))
                b = int(np.searchsorted(tb, g + w, side="left"))
                if b - a >= OLD.min_points and tb[b - 1] - tb[a] >= need - OLD.bin_s:
                    slope = theil_sen(tb[a:b], yb[a:b], OLD.level, adjust=False)
                    out.append((bisect.bisect_right(restarts, g), g, slope))
            g += step
    return out


def old_leaks(
    t: np.ndarray, y: np.ndarray, windows: list[Window]
) -> list[tuple[float, float, float]]:
    """The old ``find_leaks`` from its windows (``t``, ``y``: the data seen, sorted)."""
    w, step = OLD.window_s, OLD.step_s
    runs: list[list[Window]] = []
    for item in windows:
        piece, g, slope = item
        if not slope.low > OLD.threshold_mb_h:
            continue
        if runs and runs[-1][-1][0] == piece and abs(runs[-1][-1][1] + step - g) < 1e-6:
            runs[-1].append(item)
        else:
            runs.append([item])
    groups: list[list[list[Window]]] = []
    for run in runs:
        if groups:
            prev = groups[-1][-1]
            if prev[-1][0] != run[0][0] and run[0][1] - (prev[-1][1] + w) <= w:
                groups[-1].append(run)
                continue
        groups.append([run])
    data_end = float(t[-1])
    out = []
    for group in groups:
        ongoing = group[-1][-1][1] + w >= data_end - step
        held = group[-1][-1][1] - group[0][0][1] + step + (w if ongoing else 0.0)
        if held < OLD.sustain_s:
            continue
        rates = []
        for run in group:
            lo_t, hi_t = run[0][1], run[-1][1] + w
            if hi_t - (lo_t + w) >= w:
                lo_t += w
            a, b = np.searchsorted(t, [lo_t, hi_t], side="left")
            tb, yb = binned(t[a:b], y[a:b], OLD.bin_s)
            rates.append(theil_sen(tb, yb, OLD.level, adjust=False))
        longest = max(rates, key=lambda s: s.end - s.start)
        g0 = group[0][0][1]
        first = int(np.searchsorted(t, g0, side="left"))
        start = max(g0, float(t[first])) if first < len(t) else g0
        out.append((start, min(group[-1][-1][1] + w, data_end), longest.mb_per_hour))
    return out


def old_rule_looks(month: Month) -> list[Look]:
    """The old rule at every look, the same as running it on each look's data, faster: a
    window wholly before the look's last (partial) bin is the same at every later look, so the
    month's windows are computed once and only those reaching the look's end again."""
    full = old_windows(month.t, month.y, month.restarts, -math.inf)
    out = []
    for day in LOOK_DAYS:
        seen = month.until(day)
        cut = float(month.starts[0]) + day * DAY_S
        safe = math.floor(cut / OLD.bin_s) * OLD.bin_s - OLD.bin_s
        since = safe - OLD.window_s
        start = math.floor(since / OLD.bin_s) * OLD.bin_s - OLD.bin_s
        keep = seen.t >= start
        tail = old_windows(seen.t[keep], seen.y[keep], seen.restarts, since + 1e-6)
        windows = [x for x in full if x[1] + OLD.window_s <= since + OLD.window_s] + tail
        windows.sort(key=lambda x: x[1])
        out.append(Look(day, old_leaks(seen.t, seen.y, windows)))
    return out


@dataclass
class Tally:
    months: int = 0
    false: dict[int, int] | None = None
    any_false: int = 0
    found: dict[int, int] | None = None
    errors: list[float] | None = None
    seconds: float = 0.0

    def __post_init__(self) -> None:
        self.false = dict.fromkeys(LOOK_DAYS, 0)
        self.found = dict.fromkeys(LOOK_DAYS, 0)
        self.errors = []

    def add(self, month: Month, seen: list[Look]) -> None:
        assert self.false is not None and self.found is not None and self.errors is not None
        self.months += 1
        for look in seen:
            self.false[look.day] += bool(look.false(month))
            hit = look.on_leak(month)
            if hit:
                self.found[look.day] += 1
                self.errors.append(hit[0][2] / LEAK_MB_H - 1.0)
        self.any_false += any(look.false(month) for look in seen)


def run(
    kind: str, months: int, with_leak: bool, rule: Callable[[Month], list[Look]], seed0: int
) -> Tally:
    tally = Tally()
    started = time.perf_counter()
    for seed in range(seed0, seed0 + months):
        spec = KINDS[kind]
        if with_leak:
            month = leak_month(spec, seed, hours=LEAK_HOURS, mb_per_hour=LEAK_MB_H)
        else:
            month = generate(spec, seed)
        tally.add(month, rule(month))
    tally.seconds = time.perf_counter() - started
    return tally


def per_100(n: int, months: int) -> str:
    return f"{100.0 * n / months:5.1f}" if months else "    -"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--months", type=int, default=100, help="months per noise kind")
    parser.add_argument("--old-months", type=int, default=30, help="of which the old rule runs")
    parser.add_argument("--kinds", default=",".join(KINDS), help="noise kinds, comma-separated")
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    args = parser.parse_args()
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    rules: dict[str, tuple[Callable[[Month], list[Look]], int]] = {
        "old": (old_rule_looks, min(args.old_months, args.months)),
        "new": (lambda m: looks(m, new_rule), args.months),
    }
    days = "".join(f"  d{d:<4d}" for d in LOOK_DAYS)
    print(
        f"leak validity: looks at days {', '.join(map(str, LOOK_DAYS))}; months per noise kind:"
        f" new rule {args.months}, old rule {rules['old'][1]} (seeds from {args.seed})"
    )
    print("\n1. false leaks per 100 series-months (months with a false leak at that look)")
    print(f"{'noise':12s} {'rule':4s} {'months':>6s}{days}  any look   s/month")
    clean: dict[tuple[str, str], Tally] = {}
    for kind in kinds:
        for name, (rule, months) in rules.items():
            t = run(kind, months, False, rule, args.seed)
            clean[kind, name] = t
            assert t.false is not None
            cells = "".join(f"  {per_100(t.false[d], t.months)}" for d in LOOK_DAYS)
            print(
                f"{kind:12s} {name:4s} {t.months:6d}{cells}  {per_100(t.any_false, t.months)}"
                f"     {t.seconds / max(t.months, 1):6.2f}",
                flush=True,
            )
    print(
        f"\n2. a real leak of {LEAK_MB_H:g} MB/h over {LEAK_HOURS:g} h: % of months where it is"
        " found at each look; rate within 20 % (% of looks where found), median rate error;"
        " false leaks elsewhere per 100 months (any look)"
    )
    print(f"{'noise':12s} {'rule':4s} {'months':>6s}{days}  within20  median  false")
    for kind in kinds:
        for name, (rule, months) in rules.items():
            t = run(kind, months, True, rule, args.seed)
            assert t.found is not None and t.errors is not None
            cells = "".join(f"  {per_100(t.found[d], t.months)}" for d in LOOK_DAYS)
            err = np.array(t.errors)
            within = f"{100.0 * np.mean(np.abs(err) <= 0.2):7.1f}" if len(err) else "      -"
            median = f"{100.0 * np.median(err):+6.1f}%" if len(err) else "      -"
            print(
                f"{kind:12s} {name:4s} {t.months:6d}{cells}  {within}  {median}"
                f"  {per_100(t.any_false, t.months)}",
                flush=True,
            )


if __name__ == "__main__":
    main()
