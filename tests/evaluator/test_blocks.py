"""The latency intervals' unit of independence: whole hours and days, not pairs.

A/A months where each engine has its own hour effects (a slow hour of one engine, not of the
other): the true candidate/incumbent p95 ratio is 1. The block bootstrap's interval covers it
close to its level over many seeds; the pair bootstrap's, which takes correlated pairs for
independent ones, does not.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from evaluator.blocks import Blocks, block_weights, blocks_from_hours, blocks_from_keys
from evaluator.stats import BootstrapConfig, paired_comparison, pooled_comparison, share_delta

T0 = datetime(2026, 1, 5, tzinfo=UTC)


def hour_clustered_a_a(
    seed: int, days: int = 2, per_hour: int = 30, hour_sd: float = 0.2
) -> tuple[np.ndarray, np.ndarray, list[datetime]]:
    """Pairs of identical engines: a shared request difficulty, each engine's own log-normal
    hour effect (sd ``hour_sd``) and per-request noise."""
    rng = np.random.default_rng(seed)
    inc, cand, hours = [], [], []
    for h in range(days * 24):
        effect = rng.normal(0.0, hour_sd, 2)
        base = rng.lognormal(np.log(0.2), 0.4, per_hour)
        inc.append(base * np.exp(effect[0] + rng.normal(0, 0.2, per_hour)))
        cand.append(base * np.exp(effect[1] + rng.normal(0, 0.2, per_hour)))
        hours += [T0 + timedelta(hours=h)] * per_hour
    return np.concatenate(inc), np.concatenate(cand), hours


def test_block_bootstrap_covers_the_true_ratio_near_its_level_the_pair_bootstrap_does_not() -> None:
    config = BootstrapConfig(n_resamples=199, level=0.95)
    seeds = 60
    covered = {"blocks": 0, "pairs": 0}
    for seed in range(seeds):
        inc, cand, hours = hour_clustered_a_a(seed)
        by_blocks = paired_comparison(inc, cand, config, blocks=blocks_from_hours(hours))
        by_pairs = paired_comparison(inc, cand, config)
        covered["blocks"] += by_blocks.ratios["p95"].low <= 1.0 <= by_blocks.ratios["p95"].high
        covered["pairs"] += by_pairs.ratios["p95"].low <= 1.0 <= by_pairs.ratios["p95"].high
    assert covered["blocks"] / seeds >= 0.85, covered
    assert covered["pairs"] / seeds <= 0.80, covered
    assert covered["blocks"] - covered["pairs"] >= 0.1 * seeds, covered


def test_block_interval_narrows_with_the_level() -> None:
    inc, cand, hours = hour_clustered_a_a(3)
    blocks = blocks_from_hours(hours)
    wide = paired_comparison(inc, cand, BootstrapConfig(n_resamples=199, level=0.99), blocks=blocks)
    narrow = paired_comparison(
        inc, cand, BootstrapConfig(n_resamples=199, level=0.80), blocks=blocks
    )
    w, n = wide.ratios["p95"], narrow.ratios["p95"]
    assert w.low <= n.low and n.high <= w.high and (w.high - w.low) > (n.high - n.low)


def test_a_real_effect_is_still_seen_through_blocks() -> None:
    inc, cand, hours = hour_clustered_a_a(4, days=3)
    comp = paired_comparison(
        inc, cand * 1.3, BootstrapConfig(n_resamples=199), blocks=blocks_from_hours(hours)
    )
    assert comp.ratios["p95"].low > 1.05
    assert comp.ratios["p95"].low <= 1.3 <= comp.ratios["p95"].high * 1.05


def test_block_weights_draw_whole_hours_within_drawn_days() -> None:
    # 2 days x 3 hours, 2 items per hour
    keys = [(d, (d, h)) for d in range(2) for h in range(3) for _ in range(2)]
    blocks = blocks_from_keys(keys)
    assert (blocks.n_days, blocks.n_hours, len(blocks)) == (2, 6, 12)
    rng = np.random.default_rng(0)
    for w in block_weights(blocks, 40, rng, batch=7):
        # items of one hour always share a weight; each resample draws 2 days x 3 hours
        assert np.array_equal(w[:, 0::2], w[:, 1::2])
        assert np.all(w.sum(axis=1) == 12)


def test_subsampling_and_dropped_pairs_keep_each_pairs_hour() -> None:
    blocks = blocks_from_keys([("d", h) for h in ("a", "a", "b", "b")])
    sub = blocks.take(np.array([1, 2, 3]))
    assert isinstance(sub, Blocks) and sub.n_hours == 2 and sub.hour_of.tolist() == [0, 1, 1]
    comp = paired_comparison(
        [1.0, np.nan, 2.0, 3.0],
        [1.0, 1.0, 2.0, 3.5],
        BootstrapConfig(n_resamples=50),
        blocks=blocks,
    )
    assert comp.n == 3
    with pytest.raises(ValueError, match="blocks for 4 pairs"):
        paired_comparison([1.0, 2.0], [1.0, 2.0], blocks=blocks)


def test_pooled_and_share_delta_take_blocks() -> None:
    inc, cand, hours = hour_clustered_a_a(5, days=1, per_hour=10)
    blocks = blocks_from_hours(hours)
    groups_i = [np.full(3, v) for v in inc]
    groups_c = [np.full(3, v) for v in cand]
    ratios, spread = pooled_comparison(
        groups_i, groups_c, BootstrapConfig(pooled_resamples=49), blocks=blocks
    )
    assert ratios["p50"].low <= ratios["p50"].value <= ratios["p50"].high
    assert spread.low <= spread.value <= spread.high
    ok_i = inc < 0.25
    ok_c = cand < 0.25
    delta = share_delta(ok_i, ok_c, BootstrapConfig(n_resamples=99), blocks=blocks)
    assert delta.low <= delta.value <= delta.high
