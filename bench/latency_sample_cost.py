"""The review's latency bootstrap at 10 000 and 40 000 pairs: what the larger sample costs.

    python bench/latency_sample_cost.py [--resamples 999] [--days 30] [--repeat 3]

A month of pairs (``--days`` UTC days, pairs spread evenly over the hours), compared as the
review compares one metric (``evaluator.stats.paired_comparison`` with each pair's day and hour):
the bootstrap of p50/p95/p99 ratios, spread ratio and median delta over whole days and hours.
Prints, side by side, the seconds per metric of the former path (each resample's weights
expanded to every pair, ``weighted_quantiles_rows``) at 10 000 and 40 000 pairs and of the
review's path (per-hour weights, ``hour_weighted_quantiles``), and their ratios: the review's
``max_pairs`` of 40 000 must cost no more than 10 000 pairs did.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from evaluator.blocks import Blocks, block_bootstrap
from evaluator.stats import (
    BootstrapConfig,
    _paired_statistic,
    _weighted_paired_statistic,
    paired_comparison,
)


def month(pairs: int, days: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, Blocks]:
    hours = 24 * days
    hour_of = np.repeat(np.arange(hours), max(1, pairs // hours)).astype(np.intp)
    blocks = Blocks(hour_of, (np.arange(hours) // 24).astype(np.intp))
    inc = rng.lognormal(0, 0.5, hour_of.size)
    return inc, inc * rng.lognormal(0, 0.15, hour_of.size), blocks


def best(fn: object, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--resamples", type=int, default=999)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for pairs in (10_000, 40_000):
        a, b, blocks = month(pairs, args.days, rng)

        def expanded(a: np.ndarray = a, b: np.ndarray = b, blocks: Blocks = blocks) -> None:
            block_bootstrap(
                blocks,
                lambda w: _weighted_paired_statistic(a, b, w),
                n_resamples=args.resamples,
                level=0.95,
                rng=np.random.default_rng(1),
                point=_paired_statistic(a, b),
            )

        config = BootstrapConfig(n_resamples=args.resamples, max_pairs=pairs)

        def review(
            a: np.ndarray = a,
            b: np.ndarray = b,
            blocks: Blocks = blocks,
            config: BootstrapConfig = config,
        ) -> None:
            paired_comparison(a, b, config, blocks=blocks)

        rows.append((a.size, best(expanded, args.repeat), best(review, args.repeat)))
    base = rows[0][1]
    print(
        f"{'pairs':>7}  {'expanded weights (s)':>21}  {'per-hour weights (s)':>21}"
        "  per-hour / expanded at 10k"
    )
    for n, old, new in rows:
        print(f"{n:>7}  {old:>21.2f}  {new:>21.2f}  {new / base:>8.2f}")


if __name__ == "__main__":
    main()
