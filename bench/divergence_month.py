"""A month of greedy pairs in PostgreSQL: how long the whole divergence and quality analysis
takes at the default sample sizes, and what the block sample's ordering costs and buys.

    eval "$(shadow-ab services env)"; python bench/divergence_month.py [--days 30]
        [--pairs-per-day 1500] [--replay-share 0.2] [--probes-per-minute 1] [--repeat 2]
        [--no-semantic] [--keep] [--quality-only] [--sample-seeds 20] [--sample-only]

Needs `shadow-ab services up`. Creates a throw-away database on the local PostgreSQL server,
migrates it and loads ``--days`` days of pairs written in time order (as an ingester writes
them), each day ``--pairs-per-day`` pairs: the incumbent's answer (no logprobs: the client did
not ask), the candidate's (top-5 logprobs, as the mirror asks; 40 % of greedy answers flip one
near tie and rejoin, 2 % depart hard) and, for ``--replay-share`` of them, the replay's (top-5
logprobs; 1 % near-tie flips). Answers are the simulator's (``simulator.generate``), 8-24
tokens; day 0 is generated and the other days copy it with new pair ids. Records are written in
time order in batches of 300, as an ingester writes them (a table block then holds minutes of
traffic: what makes an unordered block sample favour the day's first hours). With the default
1,500 pairs a day, each day holds more than 4 x the 300 pairs the analysis samples, so the
candidate's sample is PostgreSQL's ``TABLESAMPLE SYSTEM`` path. Beside the clients' pairs, the
mirror's probes at ``--probes-per-minute`` (the mirror's default: 1, so 1,440 probe pairs a day):
the shipped set in turn, each probe answered right by each engine with probability 0.9, drawn
once per probe and engine (greedy answers repeat).

Then it times, in this process, ``--repeat`` times each:

1. ``analyze_divergence`` over the month with ``DivergenceConfig()`` (the review's defaults:
   300 pairs per day and role, 6,000 at most; the triads; the margins);
2. ``analyze_quality`` with ``QualityConfig()`` (every probe pair; 2,000 client pairs a day
   for JSON validity and refusals);
3. ``analyze_semantic`` with ``SemanticConfig()`` and the shipped embedding model (the
   ``semantic`` extra; left out with ``--no-semantic`` or when it is not installed), as a first
   review (it embeds at most ``max_new_per_review`` new triads) and a second one (the next new
   triads, the first ones read back from ``semantic_scores``);
4. the candidate's per-day sample alone, with the block sample ordered by pair id (now) and
   without the ordering (before), side by side: seconds, and the share of the sample sent in the
   second half of its day (0.5 is a sample spanning the day).

and prints a table of seconds, ratios and the process's peak memory (``ru_maxrss``).

``--quality-only``: the quality analysis alone, side by side in one run: ``analyze_quality``
reading every probe send (``max_sends_per_probe=None``: the review before the cap) and with the
default cap (at most 32 sends of each probe, evenly spread), alternating, ``--repeat`` times
each, then the probe figures alone (read and score) the same way: seconds, ratio, probe pairs
read of all, the accuracy delta with its interval and design effect. Then (``--sample-seeds``
months a scenario, no database; ``--sample-only`` for this part alone) the probe sample's
validity on simulated month-shaped probe months (:func:`sim_probe_month`: solid, wrong and
flaky probes, AR(1) day effects, failure bursts) for identical engines, a candidate 5 points
worse (on the threshold) and 10 points worse: the default criterion's outcome on every send
and on the sample (agreement), the estimates' difference, the interval width ratio and the
design effects, and the delta's half-width against the sends read a probe (4 .. every send).

Loading
is not timed against anything (it stands in for a month of ingestion). ``--keep`` keeps the
database and prints its URL.
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, func, literal, select, tablesample, text
from sqlalchemy.engine import make_url

from evaluator.divergence import (
    BLOCK_SAMPLE_FACTOR,
    DivergenceConfig,
    analyze_divergence,
    sample_pair_ids,
)
from evaluator.quality import QualityConfig, analyze_quality
from evaluator.semantic import EmbedderUnavailable, SemanticConfig, analyze_semantic, load_embedder
from shadow_ab.probes import SYNTHETIC_PROBE, load_probe_set
from shadow_ab.records import ExchangeRecord, TokenLogprob
from shadow_ab.settings import CommonSettings
from simulator.generate import Departure, decode, natural_length, prompt_state
from storage.db import make_engine
from storage.migrate import upgrade
from storage.models import EXCHANGES
from storage.partitions import ensure_partitions
from storage.write import write_exchanges

DEPLOYMENT = "bench-divergence"
START = datetime(2026, 10, 1, tzinfo=UTC)
GREEDY = {"model": "bench", "temperature": 0.0, "max_tokens": 24}
ASKED = {**GREEDY, "logprobs": True, "top_logprobs": 5}


def _lps(tokens: list[Any]) -> list[TokenLogprob]:
    return [TokenLogprob(token=t.text, logprob=t.logprob, top=dict(t.top)) for t in tokens]


def _rec(pid: uuid.UUID, role: str, sent: datetime, tokens: list[Any], lp: bool) -> ExchangeRecord:
    return ExchangeRecord(
        deployment=DEPLOYMENT,
        pair_id=pid,
        role=role,  # type: ignore[arg-type]  # validated
        engine="trtllm@candidate" if role == "candidate" else "vllm@incumbent",
        endpoint="chat",  # type: ignore[arg-type]
        stream=True,
        sent_at=sent,
        status="ok",  # type: ignore[arg-type]
        http_status=200,
        finish_reason="stop",
        completion_tokens=len(tokens),
        output_text="".join(t.text for t in tokens),
        logprobs=_lps(tokens) if lp else None,
        request=ASKED if lp else GREEDY,
        rewrites=["logprobs"] if lp else [],
    )


def day_records(day: int, pairs: int, replay_share: float, rng: random.Random) -> list[Any]:
    out: list[ExchangeRecord] = []
    t0 = START + timedelta(days=day)
    for k in range(pairs):
        pid = uuid.UUID(int=rng.getrandbits(128))
        sent = t0 + timedelta(seconds=(k + rng.random()) * 86_400 / pairs)
        start = prompt_state("bench", f"{day}-{k}", None)
        n = natural_length(start, 8, 24)
        ref, _ = decode(start, n, top_k=5)
        out.append(_rec(pid, "incumbent", sent, ref, lp=False))
        u = rng.random()
        dep = None
        if u < 0.40:
            dep = Departure(rng.randrange(n), True, rejoin=True)
        elif u < 0.42:
            dep = Departure(rng.randrange(n), False)
        cand, _ = decode(start, n, top_k=5, departure=dep) if dep else (ref, None)
        out.append(_rec(pid, "candidate", sent + timedelta(milliseconds=1), cand, lp=True))
        if rng.random() < replay_share:
            rdep = Departure(rng.randrange(n), True, rejoin=True) if rng.random() < 0.01 else None
            rep, _ = decode(start, n, top_k=5, departure=rdep) if rdep else (ref, None)
            out.append(_rec(pid, "replay", sent + timedelta(seconds=1), rep, lp=True))
    return out


PROBE_ACCURACY = 0.9


def probe_records(day: int, per_minute: float, rng: random.Random) -> list[ExchangeRecord]:
    """A day of the mirror's probes: one pair (incumbent, candidate) every ``60 / per_minute``
    seconds, the shipped set in turn; each engine answers a probe right or wrong the same way
    every time (drawn once per probe and engine, with :data:`PROBE_ACCURACY`)."""
    probes = load_probe_set()
    right = {
        (role, p.id): rng.random() < PROBE_ACCURACY
        for p in probes.probes
        for role in ("incumbent", "candidate")
    }
    out: list[ExchangeRecord] = []
    t0 = START + timedelta(days=day)
    n = int(per_minute * 1440)
    for k in range(n):
        probe = probes.probes[k % len(probes.probes)]
        pid = uuid.UUID(int=rng.getrandbits(128))
        sent = t0 + timedelta(seconds=(k + rng.random()) * 86_400 / max(1, n))
        for role in ("incumbent", "candidate"):
            text_ = probe.correct_answer() if right[(role, probe.id)] else probe.wrong_answer()
            out.append(
                ExchangeRecord(
                    deployment=DEPLOYMENT,
                    pair_id=pid,
                    role=role,  # type: ignore[arg-type]  # validated
                    engine="trtllm@candidate" if role == "candidate" else "vllm@incumbent",
                    endpoint="chat",  # type: ignore[arg-type]
                    stream=False,
                    sent_at=sent,
                    status="ok",  # type: ignore[arg-type]
                    http_status=200,
                    finish_reason="stop",
                    completion_tokens=max(1, len(text_.split())),
                    output_text=text_,
                    request=probe.request("bench"),
                    synthetic=SYNTHETIC_PROBE,
                    probe_id=probes.key(probe),
                )
            )
    return out


def load(
    engine: Engine, days: int, per_day: int, replay_share: float, probes_per_minute: float = 0.0
) -> tuple[int, float]:
    """Day 0's pairs are generated once; every other day is a copy with new pair ids, shifted
    by whole days (the answers repeat, the sample does not care). Written in time order in
    batches of :data:`BATCH` records, as an ingester writes them (so a table block holds
    minutes of traffic)."""
    ensure_partitions(engine, START, days_ahead=days + 1)
    rng = random.Random(12)
    template = day_records(0, per_day, replay_share, rng)
    template += probe_records(0, probes_per_minute, rng)
    rows = 0
    t0 = time.perf_counter()
    for d in range(days):
        ids: dict[Any, uuid.UUID] = {}
        recs = [
            r.model_copy(
                update={
                    "pair_id": ids.setdefault(r.pair_id, uuid.UUID(int=rng.getrandbits(128))),
                    "sent_at": r.sent_at + timedelta(days=d),
                }
            )
            for r in template
        ]
        recs.sort(key=lambda r: r.sent_at)
        for i in range(0, len(recs), BATCH):
            write_exchanges(engine, recs[i : i + BATCH])
        rows += len(recs)
        print(f"  loaded day {d + 1}/{days} ({rows:,} exchanges, {time.perf_counter() - t0:.0f} s)")
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE exchanges"))
    return rows, time.perf_counter() - t0


BATCH = 300


# -- the probe sample on month-shaped data (no database) ----------------------------------------

SAMPLE_SCENARIOS = {"A/A": 0.0, "candidate -5 pts (threshold)": 0.05, "candidate -10 pts": 0.10}
"""Probe-accuracy effects: the candidate's accuracy lower by this much (the default criterion:
``quality.probe.accuracy_delta >= -0.05``)."""
CURVE_CAPS = (4, 8, 16, 32, 64, None)
"""Sends a probe for the width-against-cap curve (None: every send)."""


def sim_probe_month(seed: int, drop: float, days: int = 30, per_minute: float = 1.0) -> list[Any]:
    """A month of the mirror's probes as the quality analysis reads them (``(pair_id, sent_at,
    probe_id, {role: (status, text)})``), month-shaped: one pair every ``60 / per_minute`` s,
    the shipped set in turn. Per probe, both engines share its kind (80 % answered right, 10 %
    wrong, 10 % flaky: a near tie whose answer flips, right with a probability drawn in
    0.2-0.8); greedy answers repeat, so a solid probe is answered alike at every send. Each
    engine has its own day effect on the flaky probes (AR(1) over the days, logit sd 0.6, 0.7
    day to day: bad days come in runs) and its own failure bursts (0.2 a day, 1-4 hours each:
    answers failed, not wrong). The candidate turns a random ``drop / 0.8`` of the right probes
    wrong for good (its accuracy ``drop`` lower)."""
    import math

    rng = random.Random(seed)
    probes = load_probe_set().probes
    kinds: list[str | float] = []
    for _ in probes:
        u = rng.random()
        kinds.append("right" if u < 0.8 else "wrong" if u < 0.9 else rng.uniform(0.2, 0.8))
    broken = {i for i, k in enumerate(kinds) if k == "right" and rng.random() < drop / 0.8}
    shift = {}
    bursts: dict[str, list[tuple[float, float]]] = {}
    for role in ("incumbent", "candidate"):
        x, xs = 0.0, []
        for _ in range(days):
            x = 0.7 * x + rng.gauss(0.0, 0.6 * math.sqrt(1 - 0.49))
            xs.append(x)
        shift[role] = xs
        bursts[role] = []
        for d in range(days):
            if rng.random() < 0.2:
                start = d * 86_400 + rng.uniform(0, 86_400)
                bursts[role].append((start, start + rng.uniform(1, 4) * 3600))
    out = []
    n = int(days * 1440 * per_minute)
    step = 86_400 / (1440 * per_minute)
    for k in range(n):
        i = k % len(probes)
        t = (k + rng.random()) * step
        day = int(t // 86_400)
        sides: dict[str, tuple[str, str | None]] = {}
        for role in ("incumbent", "candidate"):
            kind = kinds[i]
            if any(a <= t < b for a, b in bursts[role]):
                sides[role] = ("error", None)
                continue
            if role == "candidate" and i in broken:
                right = False
            elif kind == "right":
                right = True
            elif kind == "wrong":
                right = False
            else:
                assert isinstance(kind, float)
                logit = math.log(kind / (1 - kind)) + shift[role][day]
                right = rng.random() < 1 / (1 + math.exp(-logit))
            probe = probes[i]
            sides[role] = ("ok", probe.correct_answer() if right else probe.wrong_answer())
        out.append((uuid.UUID(int=rng.getrandbits(128)), START + timedelta(seconds=t), i, sides))
    return out


def _probe_pairs(month: list[Any], keep: set[Any] | None) -> dict[Any, Any]:
    from evaluator.quality import _Pair, _Side

    probes = load_probe_set()
    out = {}
    for pid, sent, i, sides in month:
        if keep is not None and pid not in keep:
            continue
        key = probes.key(probes.probes[i])
        pair = _Pair(sent)
        for role, (status, text_) in sides.items():
            pair.sides[role] = _Side(status, text_, {}, key)
        out[pid] = pair
    return out


def _judged(pairs: dict[Any, Any], days: int) -> tuple[Any, str]:
    """The accuracy delta at the review's look on day ``days`` and the default criterion's
    outcome on it (the verdict's own judge: FAIL at the look's level, PASS at its PASS level)."""
    from evaluator.policy import default_policy
    from evaluator.quality import probe_figures
    from evaluator.verdict import judge

    policy = default_policy()
    look = policy.look(float(days))
    _, ms = probe_figures(pairs, load_probe_set(), look.level)
    m = next(x for x in ms if x.key == "quality.probe.accuracy_delta")
    c = next(x for x in policy.criteria if x.key == m.key)
    return m, str(judge(c, m, look).outcome)


def sample_validity(
    seeds: int, cap: int, days: int, per_minute: float, curve_too: bool = True
) -> list[str]:
    """Full against sampled probe figures on ``seeds`` simulated months per scenario, and the
    interval's width against the cap (A/A)."""
    from evaluator.quality import spread_sample

    lines = [
        "",
        f"probe sample on month-shaped data: {seeds} months a scenario, {days} days at"
        f" {per_minute:g} probe/min, at most {cap} sends a probe (the default); the default"
        " criterion quality.probe.accuracy_delta >= -0.05 judged at the day-"
        f"{days} look (FAIL at its level, PASS at its PASS level)",
        "| scenario | months | pairs read / all (median) | outcome agreement | outcomes full"
        " (P/I/F) | outcomes sampled (P/I/F) | estimate sampled - full, median abs [max] |"
        " interval width sampled / full, median [min-max] | design effect full / sampled"
        " (median) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    curves: dict[str, dict[int | None, list[float]]] = {}
    for name, drop in SAMPLE_SCENARIOS.items():
        curve = curves[name] = {c: [] for c in CURVE_CAPS}
        agree, diffs, ratios, reads, alls = 0, [], [], [], []
        deffs: tuple[list[float], list[float]] = ([], [])
        tally: dict[str, Counter[str]] = {"full": Counter(), "sampled": Counter()}
        for seed in range(seeds):
            month = sim_probe_month(1000 * seed + int(drop * 100), drop, days, per_minute)
            sends = [(pid, sent, str(i)) for pid, sent, i, _ in month]
            full_m, full_o = _judged(_probe_pairs(month, None), days)
            chosen = set(spread_sample(sends, cap))
            samp_m, samp_o = _judged(_probe_pairs(month, chosen), days)
            reads.append(len(chosen))
            alls.append(len(month))
            tally["full"][full_o] += 1
            tally["sampled"][samp_o] += 1
            agree += full_o == samp_o
            diffs.append(abs(samp_m.value - full_m.value))
            ratios.append(
                (samp_m.interval.high - samp_m.interval.low)
                / (full_m.interval.high - full_m.interval.low)
            )
            for side, detail in ((0, full_m.detail), (1, samp_m.detail)):
                deffs[side].append(float(detail.split("design effect ")[1].split(",")[0]))
            if curve_too:
                for c in CURVE_CAPS:
                    keep = None if c is None else set(spread_sample(sends, c))
                    m, _ = _judged(_probe_pairs(month, keep), days)
                    curve[c].append((m.interval.high - m.interval.low) / 2)

        def pio(t: Counter[str]) -> str:
            return f"{t['PASS']}/{t['INCONCLUSIVE']}/{t['FAIL']}"

        med = statistics.median
        lines.append(
            f"| {name} | {seeds} | {med(reads):,.0f} / {med(alls):,.0f} | {agree}/{seeds} |"
            f" {pio(tally['full'])} | {pio(tally['sampled'])} | {med(diffs):.4f} [{max(diffs):.4f}]"
            f" | {med(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}] |"
            f" {med(deffs[0]):.1f} / {med(deffs[1]):.1f} |"
        )
    if not curve_too:
        return lines
    med = statistics.median
    lines += [
        "",
        "interval half-width of the accuracy delta against the sends read a probe (median over"
        f" {seeds} months, at the day-{days} look's level; in brackets: over every send's):",
        "| scenario | "
        + " | ".join("all" if c is None else f"{c} a probe" for c in CURVE_CAPS)
        + " |",
        "|---|" + "---|" * len(CURVE_CAPS),
    ]
    for name, curve in curves.items():
        lines.append(
            f"| {name} | "
            + " | ".join(
                f"{med(curve[c]):.4f} ({med(curve[c]) / med(curve[None]):.2f})" for c in CURVE_CAPS
            )
            + " |"
        )
    return lines


def _unordered_ids(conn: Any, lo: datetime, hi: datetime, limit: int, total: int) -> list[Any]:
    """The block sample as it was: TABLESAMPLE then LIMIT, no ordering."""
    pct = min(100.0, 100.0 * 2.0 * limit / total)
    s = tablesample(EXCHANGES, func.system(pct), name="sampled", seed=literal(7)).c
    q = (
        select(s.pair_id)
        .where(s.deployment == DEPLOYMENT, s.role == "candidate", s.sent_at >= lo, s.sent_at < hi)
        .limit(limit)
    )
    return list(conn.execute(q).scalars())


def sample_pass(engine: Engine, days: int, ordered: bool) -> tuple[float, float]:
    """Seconds to draw every day's candidate sample, and the share sent after noon."""
    x = EXCHANGES.c
    late = total_n = 0
    limit = DivergenceConfig().max_pairs_per_day
    t0 = time.perf_counter()
    with engine.connect() as conn:
        for d in range(days):
            lo = START + timedelta(days=d)
            hi = lo + timedelta(days=1)
            total = conn.execute(
                select(func.count()).where(
                    x.deployment == DEPLOYMENT,
                    x.role == "candidate",
                    x.sent_at >= lo,
                    x.sent_at < hi,
                )
            ).scalar_one()
            assert total > BLOCK_SAMPLE_FACTOR * limit, "too few pairs a day for the block sample"
            if ordered:
                ids = sample_pair_ids(conn, DEPLOYMENT, "candidate", lo, hi, limit, total)
            else:
                ids = _unordered_ids(conn, lo, hi, limit, total)
            noon = lo + timedelta(hours=12)
            sent = conn.execute(
                select(x.sent_at).where(
                    x.deployment == DEPLOYMENT,
                    x.role == "candidate",
                    x.pair_id.in_(ids),
                    x.sent_at >= lo,
                    x.sent_at < hi,
                )
            ).scalars()
            for s in sent:
                late += s >= noon
                total_n += 1
    return time.perf_counter() - t0, late / max(1, total_n)


def _quality_runs(
    engine: Engine, window: tuple[datetime, datetime], repeat: int
) -> dict[str, tuple[list[float], Any]]:
    """``analyze_quality`` with every probe send read (before) and with the default cap
    (after), alternating, ``repeat`` times each: seconds and the last section of each."""
    configs = {"before": QualityConfig(max_sends_per_probe=None), "after": QualityConfig()}
    out: dict[str, tuple[list[float], Any]] = {k: ([], None) for k in configs}
    for _ in range(repeat):
        for key, config in configs.items():
            t0 = time.perf_counter()
            section = analyze_quality(engine, DEPLOYMENT, window, config)
            out[key][0].append(time.perf_counter() - t0)
            out[key] = (out[key][0], section)
            print(f"  analyze_quality ({key}): {out[key][0][-1]:.1f} s")
    return out


def _probe_stage(
    engine: Engine, window: tuple[datetime, datetime], repeat: int
) -> dict[str, list[float]]:
    """The probe figures alone (read and score), every send (before) and the default cap
    (after), alternating: seconds."""
    from evaluator.quality import _load_probe_sample, _load_probes, probe_figures

    cap = QualityConfig().max_sends_per_probe
    assert cap is not None
    probes = load_probe_set()
    out: dict[str, list[float]] = {"before": [], "after": []}
    for _ in range(repeat):
        t0 = time.perf_counter()
        probe_figures(_load_probes(engine, DEPLOYMENT, window), probes, 0.95)
        out["before"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        probe_figures(_load_probe_sample(engine, DEPLOYMENT, window, cap)[0], probes, 0.95)
        out["after"].append(time.perf_counter() - t0)
        print(
            f"  probe figures alone: {out['before'][-1]:.1f} s before,"
            f" {out['after'][-1]:.1f} s after"
        )
    return out


def _quality_lines(runs: dict[str, tuple[list[float], Any]], per_minute: float) -> list[str]:
    med = statistics.median
    lines = [
        "",
        f"| analyze_quality, month, probes at {per_minute:g}/min | probe pairs read | seconds"
        " (median) | runs | ratio | accuracy delta [interval] | design effect |",
        "|---|---|---|---|---|---|---|",
    ]
    base = med(runs["before"][0])
    for key, label in (
        ("before", "every probe send (before)"),
        ("after", f"at most {QualityConfig().max_sends_per_probe} sends a probe (now)"),
    ):
        times, section = runs[key]
        sample = section.probes["sample"]
        m = {x.key: x for x in section.measurements()}["quality.probe.accuracy_delta"]
        iv = m.interval
        lines.append(
            f"| {label} | {sample['pairs read']:,} of {sample['pairs']:,} | {med(times):.1f} |"
            f" {', '.join(f'{t:.1f}' for t in times)} | {med(times) / base:.2f} |"
            f" {m.value:+.4f} [{iv.low:+.4f}, {iv.high:+.4f}] |"
            f" {section.probes['delta'].get('deff') or 0:.1f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--pairs-per-day", type=int, default=1500)
    parser.add_argument("--replay-share", type=float, default=0.2)
    parser.add_argument(
        "--probes-per-minute", type=float, default=1.0, help="the mirror's probes (default 1)"
    )
    parser.add_argument(
        "--no-semantic", action="store_true", help="leave out the embedding model's analysis"
    )
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the database, print its URL")
    parser.add_argument(
        "--quality-only",
        action="store_true",
        help="only the quality analysis (before / after the probe cap) and the probe sample's"
        " validity on simulated months",
    )
    parser.add_argument(
        "--sample-seeds",
        type=int,
        default=20,
        help="simulated months a scenario for the probe sample's validity (0: none)",
    )
    parser.add_argument(
        "--sample-only", action="store_true", help="only the probe sample's validity (no database)"
    )
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # a TextIOWrapper
    cap = QualityConfig().max_sends_per_probe
    assert cap is not None
    if args.sample_only:
        for line in sample_validity(args.sample_seeds, cap, args.days, args.probes_per_minute):
            print(line)
        return

    server_url = CommonSettings().database_url
    if not server_url.startswith("postgresql"):
        sys.exit("SHADOW_AB_DATABASE_URL is not PostgreSQL: run `shadow-ab services up` first")
    admin = make_engine(server_url, isolation_level="AUTOCOMMIT")
    name = f"shadow_bench_div_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    engine: Engine | None = None
    try:
        upgrade(url)
        engine = make_engine(url)
        print(f"loading {args.days} days x {args.pairs_per_day:,} pairs")
        rows, load_s = load(
            engine, args.days, args.pairs_per_day, args.replay_share, args.probes_per_minute
        )
        window = (START, START + timedelta(days=args.days))
        if args.quality_only:
            runs = _quality_runs(engine, window, args.repeat)
            alone = _probe_stage(engine, window, args.repeat)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(
                f"\nmonth: {args.days} days x {args.pairs_per_day:,} client pairs and probes at"
                f" {args.probes_per_minute:g}/min, {rows:,} exchanges (loaded in {load_s:.0f} s)"
            )
            for line in _quality_lines(runs, args.probes_per_minute):
                print(line)
            med = statistics.median
            print(
                f"| of which the probe figures alone (read and score) | | before"
                f" {med(alone['before']):.1f}, now {med(alone['after']):.1f} |"
                f" {', '.join(f'{t:.1f}' for t in alone['before'])};"
                f" {', '.join(f'{t:.1f}' for t in alone['after'])} |"
                f" {med(alone['after']) / med(alone['before']):.2f} | | |"
            )
            print(f"\npeak RSS {peak:.0f} MB")
            if args.sample_seeds:
                for line in sample_validity(
                    args.sample_seeds, cap, args.days, args.probes_per_minute
                ):
                    print(line)
            return
        times: list[float] = []
        section = None
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            section = analyze_divergence(engine, DEPLOYMENT, window, DivergenceConfig())
            times.append(time.perf_counter() - t0)
            print(f"  analyze_divergence: {times[-1]:.1f} s")
        assert section is not None
        d = section.to_dict()
        m = {x.key: x for x in section.measurements()}
        q_times: list[float] = []
        quality = None
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            quality = analyze_quality(engine, DEPLOYMENT, window, QualityConfig())
            q_times.append(time.perf_counter() - t0)
            print(f"  analyze_quality: {q_times[-1]:.1f} s")
        assert quality is not None
        qm = {x.key: x for x in quality.measurements()}
        s_times: list[float] = []
        s_cpu: list[float] = []
        semantic = None
        why_not = "--no-semantic" if args.no_semantic else ""
        if not why_not:
            try:
                load_embedder()
            except EmbedderUnavailable as exc:
                why_not = str(exc)
        if not why_not:
            for _ in range(2):  # a first review embeds; the second embeds the next ones
                t0, c0 = time.perf_counter(), time.process_time()
                semantic = analyze_semantic(engine, DEPLOYMENT, window, SemanticConfig())
                s_times.append(time.perf_counter() - t0)
                s_cpu.append(time.process_time() - c0)
                print(
                    f"  analyze_semantic: {s_times[-1]:.1f} s ({semantic.scored_new} triads"
                    f" embedded, {semantic.texts_embedded} texts)"
                )
        ordered = [sample_pass(engine, args.days, True) for _ in range(args.repeat)]
        unordered = [sample_pass(engine, args.days, False) for _ in range(args.repeat)]
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        med = statistics.median
        o_s, u_s = med(t for t, _ in ordered), med(t for t, _ in unordered)
        print()
        print(
            f"month: {args.days} days x {args.pairs_per_day:,} pairs, {rows:,} exchanges"
            f" (loaded in {load_s:.0f} s); replay share {args.replay_share:g}"
        )
        print(
            f"sampled: candidate {d['candidate']['pairs_sampled']:,}, replay"
            f" {d['replay']['pairs_sampled']:,}, triads {d['triads']['n']:,}"
        )
        hard = m["divergence.hard_excess_rate"]
        print(
            f"figures: exact excess {m['divergence.excess_rate'].value:.3f}, hard excess"
            f" {hard.value:.3f} {hard.interval}, near-tie share"
            f" {m['divergence.near_tie_share'].value:.3f}"
        )
        probes = quality.probes.get("delta") or {}
        print(
            f"quality: {probes.get('n', 0):,} probe pairs, accuracy delta"
            f" {qm['quality.probe.accuracy_delta'].value}"
            f" {qm['quality.probe.accuracy_delta'].interval} (design effect"
            f" {probes.get('deff') or 0:.1f}); JSON pairs {quality.json['delta']['n']:,};"
            f" refusal pairs {quality.refusal['delta']['n']:,}"
        )
        if semantic is not None:
            sm = {x.key: x for x in semantic.measurements()}["divergence.semantic.excess"]
            print(f"semantic: {sm.n} triads scored, excess {sm.value} {sm.interval}")
        else:
            print(f"semantic: not measured ({why_not})")
        print()
        print("| step | seconds (median of runs) | runs | ratio | sample after noon |")
        print("|---|---|---|---|---|")
        print(
            f"| analyze_divergence, month, defaults | {med(times):.1f} |"
            f" {', '.join(f'{t:.1f}' for t in times)} | | |"
        )
        print(
            f"| analyze_quality, month, defaults (probes at {args.probes_per_minute:g}/min)"
            f" | {med(q_times):.1f} | {', '.join(f'{t:.1f}' for t in q_times)} |"
            f" {med(q_times) / med(times):.2f} x divergence | |"
        )
        total = med(times) + med(q_times)
        if semantic is not None:
            print(
                f"| analyze_semantic, first review (embeds at most"
                f" {SemanticConfig().max_new_per_review} new triads; CPU {s_cpu[0]:.1f} s) |"
                f" {s_times[0]:.1f} | {s_times[0]:.1f} | {s_times[0] / med(times):.2f} x"
                " divergence | |"
            )
            print(
                f"| analyze_semantic, second review (the next new triads; the first ones read"
                f" back from semantic_scores; CPU {s_cpu[1]:.1f} s) |"
                f" {s_times[1]:.1f} | {s_times[1]:.1f} | {s_times[1] / med(times):.2f} x"
                " divergence | |"
            )
            total += s_times[0]
        print(
            "| divergence + quality" + (" + semantic (first)" if semantic else "") + " |"
            f" {total:.1f} | | | |"
        )
        print(
            f"| candidate day samples, ordered by pair id (now) | {o_s:.2f} |"
            f" {', '.join(f'{t:.2f}' for t, _ in ordered)} | {o_s / u_s:.2f} x before |"
            f" {ordered[0][1]:.2f} |"
        )
        print(
            f"| candidate day samples, TABLESAMPLE then LIMIT (before) | {u_s:.2f} |"
            f" {', '.join(f'{t:.2f}' for t, _ in unordered)} | 1 | {unordered[0][1]:.2f} |"
        )
        print(f"\npeak RSS {peak:.0f} MB")
        if args.keep:
            print(f"kept: {make_url(url).render_as_string(hide_password=True)}")
    finally:
        if engine is not None:
            engine.dispose()
        if not args.keep:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()
