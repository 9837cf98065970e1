"""Issue 12's divergence machinery on a real cross-kernel change: vLLM bf16 -> fp32.

    flock /tmp/vllm.lock python bench/real_kernels.py [--prompts 250] [--concurrency 4]
        [--max-tokens 16,32,64] [--replay-delay 1.0] [--top-logprobs 5] [--near-tie-nats 0.5]
        [--no-aa] [--database-url URL] [--seed 0] [--json PATH]

Needs ``shadow-ab engine vllm prepare`` first and about 4 GB of memory per engine (three with
the A/A row); on a machine shared with other real-engine jobs run it under a lock such as
``flock``. Starts real vLLM (the CPU build, the tiny random Llama) in bfloat16 (the incumbent,
CPU 0) and float32 (the candidate, CPU 1), and for the A/A row a second bfloat16 server (CPU 1).
Per row it starts ``shadow-ab mirror`` in front of the incumbent and that row's candidate with
every request shadowed and replayed (``shadow.rate`` and ``replay_rate`` 1, the guard off),
replays sent apart (``--replay-delay``, their own connection pool), the candidate and the replay
asked for ``--top-logprobs``; sends ``--prompts`` greedy requests of the realistic mix sized for
the tiny model (chat and completions, streamed and not, multi-turn; the same requests for every
row, ``--seed``); records go to a SQLite file in a temporary folder (or ``--database-url``).
Then it builds the review under the default policy (its ``min_days`` and ``min_pairs`` waived
and its plan one look, as the demo does: a run lasts minutes) with the semantic analysis scoring
every triad, and prints one table: pairs, triads, divergence rates, exact / hard excess with
intervals, the near-tie share, the margin at the first divergence (quantiles, how many known,
lower bounds, unknown), finish-mismatch excess, length shift, semantic excess, and each
divergence criterion's verdict. A second table checks the plumbing the figures rest on: replays
recorded as sent apart and later than their original, logprobs present on candidate and replay.

Time: starting the engines dominates (three at once took 9 minutes on 2 busy cores; ``--no-aa``
starts two); 250 prompts per row take about 3 minutes, each review under a minute.
``--review-only`` reviews an earlier run's rows again (its ``--database-url`` and ``--tag``),
e.g. at another ``--near-tie-nats``, without engines.

What it shows and does not: the model has random weights, so its next-token distributions are
nearly flat (top logprobs around -6.4 with a vocabulary of 1024, ln 1024 = 6.93): almost every
greedy choice is a near tie, and after a flip it writes other gibberish. The figures measure
how the machinery reads a real engine pair (wire format, margins, replays, the verdict), not
where a real model's margins lie.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select

from shadow_ab.dev.engines import vllm_cpu
from shadow_ab.dev.engines.vllm_cpu import EngineSpec, RunningVllm
from shadow_ab.dev.processes import running_mirror
from shadow_ab.dev.traffic import TrafficMix, make_mix, make_plan, make_session, run_traffic
from storage.db import make_engine
from storage.models import EXCHANGES

MARGIN_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)
FIGURES = (
    "divergence.candidate_rate",
    "divergence.noise_rate",
    "divergence.excess_rate",
    "divergence.near_tie_share",
    "divergence.hard_excess_rate",
    "divergence.finish_mismatch.excess",
    "divergence.length_shift",
    "divergence.semantic.excess",
    "divergence.semantic.candidate_mean",
    "divergence.semantic.floor_mean",
)
WAIVER = (
    "bench/real_kernels.py: the policy's minimum days and pairs were waived and its plan is one"
    " look (a run lasts minutes)."
)


@dataclass(frozen=True)
class Row:
    """One comparison: the candidate engine the mirror shadows to."""

    name: str
    deployment: str
    candidate: RunningVllm | None
    label: str


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def greedy_mix(max_tokens: tuple[int, ...]) -> TrafficMix:
    """The demo's realistic mix for the tiny model (1024 tokens of context), every request
    greedy (the pairs divergence judges), no JSON asks (a random model cannot follow them)."""
    return make_mix(
        model=vllm_cpu.SERVED_MODEL,
        greedy_share=1.0,
        json_share=0.0,
        long_prompt_share=0.1,
        long_prompt_words=(80, 200),
        max_tokens=max_tokens,
        max_turns=3,
    )


async def send(base_url: str, mix: TrafficMix, args: argparse.Namespace) -> Any:
    plan = make_plan(
        concurrency=args.concurrency, requests=args.prompts, timeout_s=300.0, seed=args.seed
    )
    async with make_session() as session:
        return await run_traffic(session, base_url, mix, plan)


def mirror_traffic(
    inc: RunningVllm, row: Row, url: str, mix: TrafficMix, args: argparse.Namespace
) -> None:
    assert row.candidate is not None
    with running_mirror(
        inc.base_url,
        row.candidate.base_url,
        database_url=url,
        deployment=row.deployment,
        shadow={
            "rate": 1.0,
            "replay_rate": 1.0,
            "replay_delay_s": args.replay_delay,
            "top_logprobs": args.top_logprobs,
        },
        guard={"enabled": False},  # every request shadowed and replayed
        incumbent={"flavor": "vllm", "engine": "vllm-bf16@incumbent"},
        candidate={"flavor": "vllm", "engine": f"vllm-{row.label}@candidate"},
        health={"interval_s": 1.0},
        drain_timeout_s=120.0,
    ) as mirror:
        started = time.monotonic()
        result = asyncio.run(send(mirror.base_url, mix, args))
        mirror.stop()  # shadow requests drained, records flushed
    say(
        f"  {row.name}: {len(result.rows)} requests, {len(result.errors)} errors,"
        f" {time.monotonic() - started:.0f}s"
    )


def plumbing(url: str, deployment: str) -> dict[str, Any]:
    """What the figures rest on, read from the records: replays sent apart (their rewrites,
    and how long after the original they left), logprobs kept on the candidate and replay."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            cols = EXCHANGES.c
            rows = conn.execute(
                select(
                    cols.pair_id, cols.role, cols.sent_at, cols.status, cols.rewrites, cols.logprobs
                ).where(cols.deployment == deployment)
            ).all()
    finally:
        engine.dispose()
    by_pair: dict[str, dict[str, Any]] = {}
    for r in rows:
        by_pair.setdefault(str(r.pair_id), {})[r.role] = r
    out: dict[str, Any] = {}
    for role in ("incumbent", "candidate", "replay"):
        recs = [p[role] for p in by_pair.values() if role in p]
        out[f"{role}_records"] = len(recs)
        out[f"{role}_ok"] = sum(r.status == "ok" for r in recs)
        out[f"{role}_with_logprobs"] = sum(bool(decode(r.logprobs)) for r in recs)
    replays = [p["replay"] for p in by_pair.values() if "replay" in p]
    out["replay_rewrites"] = sorted(
        {w for r in replays for w in decode(r.rewrites) or () if w.startswith("replay_")}
    )
    lags = [
        (p["replay"].sent_at - p["incumbent"].sent_at).total_seconds()
        for p in by_pair.values()
        if "replay" in p and "incumbent" in p
    ]
    # How flat the model is: the greedy token's lead over the runner-up at every token the
    # candidate generated (its top logprobs), whether or not the pair diverged there.
    gaps = []
    for p in by_pair.values():
        for lp in decode(p["candidate"].logprobs) or () if "candidate" in p else ():
            top = sorted((decode(lp).get("top") or {}).values(), reverse=True)
            if len(top) >= 2:
                gaps.append(top[0] - top[1])
    out["top2_gap"] = quantiles(gaps)
    out["top2_gap_tokens"] = len(gaps)
    out["replay_lag_s_min"] = min(lags) if lags else None
    out["replay_lag_s_median"] = statistics.median(lags) if lags else None
    return out


def decode(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    out = {}
    for q in MARGIN_QUANTILES:
        pos = q * (len(ordered) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(ordered) - 1)
        out[f"p{round(q * 100):g}"] = ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
    return out


def review_row(url: str, row: Row, args: argparse.Namespace) -> dict[str, Any]:
    """Build the review under the default policy (data minimums waived, one look) and the
    divergence section's margins."""
    from evaluator.divergence import DivergenceConfig, analyze_divergence
    from evaluator.policy import default_policy
    from evaluator.review import build_review, default_analyses, resolve_window
    from evaluator.semantic import SemanticConfig

    policy = default_policy().with_minimums(
        min_days=0.0, min_pairs=0, horizon_days=1.0, note=WAIVER
    )
    divergence_config = DivergenceConfig(near_tie_nats=args.near_tie_nats)
    analyses = default_analyses(
        divergence_config=divergence_config,
        semantic_config=SemanticConfig(max_new_per_review=None),
    )
    engine = make_engine(url)
    try:
        window = resolve_window(engine, row.deployment)
        started = time.monotonic()
        review = build_review(
            engine, row.deployment, window, policy, analyses=analyses, with_html=False, store=False
        )
        took = time.monotonic() - started
        level = review.verdict.look.level if review.verdict.look else 0.95
        section = analyze_divergence(
            engine, row.deployment, window, config=DivergenceConfig(
                near_tie_nats=args.near_tie_nats, level=level
            )
        )  # fmt: skip
    finally:
        engine.dispose()
    figures = {m.key: m for m in review.measurements}
    out: dict[str, Any] = {"row": row.name, "review_s": took, "level": level}
    out["pairs"] = int(review.data["pairs"])
    out["triads"] = len(section.triads.day)
    for key in FIGURES:
        m = figures.get(key)
        out[key] = {
            "value": None if m is None else m.value,
            "interval": None
            if m is None or m.interval is None
            else [m.interval.low, m.interval.high],
            "n": None if m is None else m.n,
        }
    c = section.candidate
    examples = c.examples
    known = [e["margin"] for e in examples if e["margin"] is not None and not e["margin_bound"]]
    bounds = [e["margin"] for e in examples if e["margin"] is not None and e["margin_bound"]]
    out["margins"] = {
        "diverged": c.diverged,
        "exact": len(known),
        "lower_bound": len(bounds),
        "none": sum(e["margin"] is None for e in examples),
        "unknown": sum(e["near_tie"] is None for e in examples),
        "quantiles": quantiles(known),
        "max": max(known) if known else None,
        "positions": quantiles([float(p) for p in c.positions]),
    }
    out["criteria"] = {
        str(r.criterion.key): str(r.outcome)
        for r in review.verdict.results
        if r.criterion.key.startswith("divergence.")
    }
    out["decision"] = str(review.verdict.decision)
    out["plumbing"] = plumbing(url, row.deployment)
    return out


def fmt_share(fig: dict[str, Any], pct: bool = True) -> str:
    value, iv = fig["value"], fig["interval"]
    if value is None:
        return "-"
    scale, unit = (100.0, " pts") if pct else (1.0, "")
    text_ = f"{value * scale:+.1f}" if pct else f"{value:+.3f}"
    if iv is not None:
        text_ += (
            f" [{iv[0] * scale:+.1f}, {iv[1] * scale:+.1f}]"
            if pct
            else (f" [{iv[0]:+.3f}, {iv[1]:+.3f}]")
        )
    return text_ + (unit if pct else "")


def fmt_rate(fig: dict[str, Any]) -> str:
    value = fig["value"]
    return "-" if value is None else f"{value * 100:.1f} %"


def print_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    names = [r["row"] for r in rows]
    lines: list[tuple[str, list[str]]] = [
        ("pairs / triads", [f"{r['pairs']} / {r['triads']}" for r in rows]),
        ("candidate divergence rate", [fmt_rate(r["divergence.candidate_rate"]) for r in rows]),
        ("replay noise rate", [fmt_rate(r["divergence.noise_rate"]) for r in rows]),
        ("exact excess [interval]", [fmt_share(r["divergence.excess_rate"]) for r in rows]),
        ("near-tie share of divergences", [fmt_rate(r["divergence.near_tie_share"]) for r in rows]),
        ("hard excess [interval]", [fmt_share(r["divergence.hard_excess_rate"]) for r in rows]),
        (
            "margin at 1st divergence: exact / bound / unknown",
            ["{exact} / {lower_bound} / {unknown}".format(**r["margins"]) for r in rows],
        ),
        (
            "margin p10 / p50 / p90 / p99 / max (nats)",
            [
                " / ".join(
                    f"{r['margins']['quantiles'].get(k, float('nan')):.3f}"
                    for k in ("p10", "p50", "p90", "p99")
                )
                + (f" / {r['margins']['max']:.3f}" if r["margins"]["max"] is not None else "")
                if r["margins"]["quantiles"]
                else "-"
                for r in rows
            ],
        ),
        (
            "first divergence token p10 / p50 / p90",
            [
                " / ".join(
                    f"{r['margins']['positions'].get(k, 0):.0f}" for k in ("p10", "p50", "p90")
                )
                if r["margins"]["positions"]
                else "-"
                for r in rows
            ],
        ),
        (
            "finish mismatch excess [interval]",
            [fmt_share(r["divergence.finish_mismatch.excess"]) for r in rows],
        ),
        (
            "length shift [interval]",
            [fmt_share(r["divergence.length_shift"], pct=False) for r in rows],
        ),
        (
            "semantic excess [interval]",
            [fmt_share(r["divergence.semantic.excess"], pct=False) for r in rows],
        ),
        (
            "semantic mean: candidate / floor",
            [
                "-"
                if r["divergence.semantic.candidate_mean"]["value"] is None
                else f"{r['divergence.semantic.candidate_mean']['value']:.3f} /"
                f" {r['divergence.semantic.floor_mean']['value']:.3f}"
                for r in rows
            ],
        ),
    ]
    keys = list(dict.fromkeys(k for r in rows for k in r["criteria"]))
    for key in keys:
        lines.append((f"verdict: {key}", [r["criteria"].get(key, "-") for r in rows]))
    lines.append(("review decision (all criteria)", [r["decision"] for r in rows]))
    lines.append(("interval level (one look)", [f"{r['level']:.4f}" for r in rows]))
    print(f"\n| figure | {' | '.join(names)} |")
    print("|---|" + "---|" * len(names))
    for label, cells in lines:
        print(f"| {label} | {' | '.join(cells)} |")
    print(f"\n| plumbing | {' | '.join(names)} |")
    print("|---|" + "---|" * len(names))
    plumb = [r["plumbing"] for r in rows]
    for role in ("incumbent", "candidate", "replay"):
        print(
            f"| {role}: records / ok / with logprobs | "
            + " | ".join(
                f"{p[f'{role}_records']} / {p[f'{role}_ok']} / {p[f'{role}_with_logprobs']}"
                for p in plumb
            )
            + " |"
        )
    print(
        "| replay rewrites | " + " | ".join(", ".join(p["replay_rewrites"]) for p in plumb) + " |"
    )
    print(
        "| candidate tokens: greedy lead over the runner-up p50 / p90 / p99 nats (tokens) | "
        + " | ".join(
            " / ".join(f"{p['top2_gap'][k]:.3f}" for k in ("p50", "p90", "p99"))
            + f" ({p['top2_gap_tokens']})"
            if p["top2_gap"]
            else "-"
            for p in plumb
        )
        + " |"
    )
    print(
        "| replay sent after its original: min / median s | "
        + " | ".join(
            f"{p['replay_lag_s_min']:.2f} / {p['replay_lag_s_median']:.2f}"
            if p["replay_lag_s_min"] is not None
            else "-"
            for p in plumb
        )
        + " |"
    )


def review_only(args: argparse.Namespace) -> None:
    """Review the rows an earlier run recorded (its --database-url and --tag)."""
    results = []
    for name, kind in (("bf16 -> fp32", "fp32"), ("bf16 -> bf16 (A/A)", "aa")):
        if kind == "aa" and args.no_aa:
            continue
        row = Row(name, f"real-kernels-{kind}-{args.tag}", None, kind)
        results.append(review_row(args.database_url, row, args))
    print(f"\nreview of {args.database_url}, tag {args.tag}; near_tie_nats {args.near_tie_nats:g}")
    print_table(results, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=250, help="greedy requests per row")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", default="16,32,64", help="each request's max_tokens from")
    parser.add_argument("--replay-delay", type=float, default=1.0, help="shadow.replay_delay_s")
    parser.add_argument("--top-logprobs", type=int, default=5, help="shadow.top_logprobs")
    parser.add_argument("--near-tie-nats", type=float, default=0.5)
    parser.add_argument("--no-aa", action="store_true", help="skip the bf16 vs bf16 row")
    parser.add_argument("--seed", type=int, default=0, help="the requests' seed")
    parser.add_argument("--database-url", help="store (default: SQLite in a temporary folder)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    parser.add_argument("--tag", default=str(os.getpid()), help="in the deployments' names")
    parser.add_argument(
        "--review-only",
        action="store_true",
        help="no engines: review the rows a run with this --database-url and --tag recorded",
    )
    args = parser.parse_args()
    if args.prompts < 1 or args.concurrency < 1:
        parser.error("--prompts and --concurrency must be at least 1")
    if args.review_only and not args.database_url:
        parser.error("--review-only needs the --database-url (and --tag) of an earlier run")
    try:
        max_tokens = tuple(int(x) for x in args.max_tokens.split(",") if x.strip())
    except ValueError:
        parser.error(f"--max-tokens {args.max_tokens!r}: integers separated by commas")
    if args.review_only:
        review_only(args)
        return
    try:
        cpu = vllm_cpu.check_machine()
    except vllm_cpu.EngineUnavailable as exc:
        sys.exit(f"bench/real_kernels.py: {exc}")
    lay = vllm_cpu.layout()
    if not vllm_cpu.venv_ready(lay):
        sys.exit(
            f"bench/real_kernels.py: no vllm-cpu venv at {lay.venv}: run"
            " `shadow-ab engine vllm prepare` first"
        )
    from storage.migrate import upgrade

    mix = greedy_mix(max_tokens)
    cpu0, cpu1 = vllm_cpu.own_cpus()
    tag = args.tag
    specs = [
        EngineSpec("bfloat16", cpu0, f"kernels-bf16-{tag}"),
        EngineSpec("float32", cpu1, f"kernels-fp32-{tag}"),
    ]
    if not args.no_aa:
        specs.append(EngineSpec("bfloat16", cpu1, f"kernels-bf16b-{tag}"))
    say(
        f"bench/real_kernels.py: real vLLM {vllm_cpu.VLLM_CPU_VERSION} ({cpu.kernels} kernels):"
        f" bf16 incumbent on CPU {cpu0}, fp32 candidate on CPU {cpu1}"
        + ("" if args.no_aa else f", bf16 A/A candidate on CPU {cpu1}")
        + f"; {args.prompts} greedy prompts per row; load average {os.getloadavg()[0]:.2f}"
    )
    started = time.monotonic()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="shadow-ab-real-kernels-") as tmp:
        url = args.database_url or f"sqlite:///{Path(tmp) / 'records.db'}"
        upgrade(url)
        with vllm_cpu.running_vllms(specs) as engines:
            say(f"  engines healthy in {time.monotonic() - started:.0f}s")
            inc = engines[0]
            rows = [Row("bf16 -> fp32", f"real-kernels-fp32-{tag}", engines[1], "fp32")]
            if not args.no_aa:
                rows.append(
                    Row("bf16 -> bf16 (A/A)", f"real-kernels-aa-{tag}", engines[2], "bf16b")
                )
            for row in rows:
                mirror_traffic(inc, row, url, mix, args)
        for row in rows:  # engines stopped: the review has the CPUs
            results.append(review_row(url, row, args))
            say(f"  {row.name}: reviewed in {results[-1]['review_s']:.0f}s")
    print(
        f"\nreal vLLM {vllm_cpu.VLLM_CPU_VERSION} (vllm-cpu), tiny random Llama; incumbent bf16;"
        f" {args.prompts} greedy prompts (max_tokens {args.max_tokens}), concurrency"
        f" {args.concurrency}; every request shadowed and replayed, replay delay"
        f" {args.replay_delay:g}s, top_logprobs {args.top_logprobs}, near_tie_nats"
        f" {args.near_tie_nats:g}; {time.monotonic() - started:.0f}s in all; load average"
        f" {os.getloadavg()[0]:.2f}"
    )
    print_table(results, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
