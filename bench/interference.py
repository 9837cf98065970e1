"""Interference on shared hardware: two real vLLMs on the same cores, shadowing off and on.

    python bench/interference.py [--duration 30] [--repeat 2]
        [--concurrency 4] [--max-tokens 32] [--configs off,on,guard,guard-windows,parity]
        [--cpus 0-1] [--json PATH]

Needs ``shadow-ab engine vllm prepare`` first, and about 8 GB of memory for the two engines (on
a machine shared with other real-engine jobs, run it under a lock such as ``flock``). Starts
real vLLM (the CPU build, the tiny model) twice, the incumbent in bfloat16 and the candidate
in float32, **both on the same CPUs** (``--cpus``, default all of them: the mission's "same
GPUs" in small), warms both up, then for each configuration starts ``shadow-ab mirror`` in
front of them (records to a temporary SQLite file) and sends closed-loop traffic through it:
one fixed request shape (streaming greedy chat, a short prompt, ``--max-tokens``),
``--concurrency`` clients. Configurations:

- ``off``: shadow rate 0 (the incumbent alone behind the mirror: the reference);
- ``on``: every request shadowed to the candidate, guard off, no load parity;
- ``guard``: every request sampled, the interference guard on with its defaults;
- ``guard-windows``: the guard with shadow-off windows (5 s of every 15 s), which give it a
  shadow-free baseline to judge against;
- ``parity``: every request shadowed, guard off, ``shadow.load_parity: 1`` (the candidate never
  holds more requests at dispatch than the incumbent).

Each round runs every configuration once, in a rotated order (``--repeat`` rounds, rows pooled
per configuration), each after the candidate has gone idle. Per configuration the table prints
the incumbent's client-side TTFT and E2E p50/p99 (the client's own clock), their ratio to
``off`` at the same percentile, the shadow decisions the mirror counted
(``shadow_ab_mirror_shadow_decisions_total``: sampled, skipped by the guard, by load parity, by
the cap), the guard's rate multiplier at the end, and from the stored records the candidate's
answers, its TTFT p50 and its requests in flight at dispatch (median, max) next to the
incumbent's.

The tiny model answers almost at once (inter-token gaps near 0): what is measured is how two
engines share two cores and what the mirror's controls do about it, not how vLLM decodes a real
model. The client and the mirror share the same cores too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import text

from shadow_ab.dev.engines import vllm_cpu
from shadow_ab.dev.engines.vllm_cpu import EngineSpec, RunningVllm
from shadow_ab.dev.processes import running_mirror
from shadow_ab.dev.traffic import (
    RequestRow,
    TrafficMix,
    make_plan,
    make_session,
    quantile,
    run_traffic,
)
from storage.db import make_engine

CONFIGS: dict[str, dict[str, Any]] = {
    "off": {"shadow": {"rate": 0.0}, "guard": {"enabled": False}},
    "on": {"shadow": {"rate": 1.0}, "guard": {"enabled": False}},
    "guard": {"shadow": {"rate": 1.0}, "guard": {"enabled": True}},
    "guard-windows": {
        "shadow": {"rate": 1.0},
        "guard": {"enabled": True, "off_window_every_s": 15.0, "off_window_s": 5.0},
    },
    "parity": {"shadow": {"rate": 1.0, "load_parity": 1.0}, "guard": {"enabled": False}},
}
DECISIONS = ("sampled", "skipped_guard", "skipped_load_parity", "skipped_cap")


@dataclass
class Segment:
    """One configuration's pooled measurements."""

    rows: list[RequestRow] = field(default_factory=list)
    decisions: dict[str, float] = field(default_factory=dict)
    guard_rate: list[float] = field(default_factory=list)
    cand_ttft: list[float] = field(default_factory=list)
    cand_ok: int = 0
    cand_sent: int = 0
    inflight_inc: list[int] = field(default_factory=list)
    inflight_cand: list[int] = field(default_factory=list)


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def records(url: str) -> list[dict[str, Any]]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT role, status, ttft_s, inflight_incumbent, inflight_candidate"
                    " FROM exchanges"
                )
            ).all()
        return [dict(r._mapping) for r in rows]
    finally:
        engine.dispose()


async def traffic(base_url: str, mix: TrafficMix, concurrency: int, duration_s: float) -> Any:
    plan = make_plan(concurrency=concurrency, duration_s=duration_s, timeout_s=300.0)
    async with make_session() as session:
        return await run_traffic(session, base_url, mix, plan)


def wait_idle(engine: RunningVllm, timeout_s: float = 120.0) -> None:
    """Wait until the engine runs and queues no request (its /metrics gauges)."""
    from shadow_ab.dev.processes import http_get

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status, body = http_get(engine.base_url + "/metrics", timeout=5.0)
        if status == 200:
            busy = 0.0
            for line in body.decode().splitlines():
                if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
                    busy += float(line.rsplit(" ", 1)[1])
            if busy == 0:
                return
        time.sleep(0.5)
    say(f"  (engine {engine.dtype} still busy after {timeout_s:.0f}s)")


def run_segment(
    name: str,
    inc: RunningVllm,
    cand: RunningVllm,
    mix: TrafficMix,
    args: argparse.Namespace,
    seg: Segment,
) -> None:
    settings = CONFIGS[name]
    with running_mirror(
        inc.base_url,
        cand.base_url,
        deployment=f"interference-{name}",
        incumbent={"flavor": "vllm", "engine": "vllm-bf16@incumbent"},
        candidate={"flavor": "vllm", "engine": "vllm-fp32@candidate"},
        health_enabled=False,
        drain_timeout_s=60.0,
        **settings,
    ) as mirror:
        result = asyncio.run(traffic(mirror.base_url, mix, args.concurrency, args.duration))
        for d in DECISIONS:
            value = mirror.metric("shadow_ab_mirror_shadow_decisions_total", decision=d)
            seg.decisions[d] = seg.decisions.get(d, 0.0) + value
        seg.guard_rate.append(mirror.metric("shadow_ab_mirror_guard_rate_ratio"))
        mirror.stop()
        assert mirror.database_url is not None
        recs = records(mirror.database_url)
    seg.rows += result.rows
    for r in recs:
        if r["role"] == "incumbent":
            seg.inflight_inc.append(r["inflight_incumbent"] or 0)
        elif r["role"] == "candidate":
            seg.cand_sent += 1
            seg.inflight_cand.append(r["inflight_candidate"] or 0)
            if r["status"] == "ok":
                seg.cand_ok += 1
                if r["ttft_s"] is not None:
                    seg.cand_ttft.append(r["ttft_s"])
    errors = len(result.errors)
    say(
        f"  {name:<14} {len(result.rows):>5} requests, {errors} errors,"
        f" TTFT p50 {ms(quantile(result.values('ttft_s'), 0.5))}"
    )


def ms(seconds: float | None) -> str:
    if seconds is None or seconds != seconds:
        return "-"
    return f"{seconds * 1000:.0f}"


def table(segments: dict[str, Segment]) -> list[dict[str, Any]]:
    ref = segments.get("off")

    def q(seg: Segment, name: str, p: float) -> float:
        return quantile([v for r in seg.rows if r.ok and (v := getattr(r, name)) is not None], p)

    out = []
    for name, seg in segments.items():
        row: dict[str, Any] = {
            "config": name,
            "requests": len(seg.rows),
            "errors": sum(not r.ok for r in seg.rows),
        }
        for metric in ("ttft_s", "e2e_s"):
            for label, p in (("p50", 0.5), ("p99", 0.99)):
                value = q(seg, metric, p)
                row[f"{metric[:-2]}_{label}_s"] = value
                row[f"{metric[:-2]}_{label}_vs_off"] = (
                    value / q(ref, metric, p) if ref is not None and q(ref, metric, p) > 0 else None
                )
        row["decisions"] = {k: int(v) for k, v in seg.decisions.items()}
        row["guard_rate_end"] = min(seg.guard_rate) if seg.guard_rate else None
        row["candidate_sent"] = seg.cand_sent
        row["candidate_ok"] = seg.cand_ok
        row["candidate_ttft_p50_s"] = statistics.median(seg.cand_ttft) if seg.cand_ttft else None
        row["inflight_incumbent_median"] = (
            statistics.median(seg.inflight_inc) if seg.inflight_inc else None
        )
        row["inflight_candidate_median"] = (
            statistics.median(seg.inflight_cand) if seg.inflight_cand else None
        )
        row["inflight_candidate_max"] = max(seg.inflight_cand) if seg.inflight_cand else None
        out.append(row)
    return out


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (
        "| config | requests | inc TTFT p50 / p99 ms | vs off | inc E2E p50 / p99 ms | vs off"
        " | sampled | skipped guard / parity / cap | guard rate | cand sent (ok) | cand TTFT"
        " p50 ms | in flight at dispatch: inc median, cand median / max |"
    )
    print(head)
    print("|" + "---|" * head.count(" | ") + "---|")
    for r in rows:
        d = r["decisions"]
        print(
            f"| {r['config']} | {r['requests']} ({r['errors']} err)"
            f" | {ms(r['ttft_p50_s'])} / {ms(r['ttft_p99_s'])}"
            f" | {times(r['ttft_p50_vs_off'])} / {times(r['ttft_p99_vs_off'])}"
            f" | {ms(r['e2e_p50_s'])} / {ms(r['e2e_p99_s'])}"
            f" | {times(r['e2e_p50_vs_off'])} / {times(r['e2e_p99_vs_off'])}"
            f" | {d.get('sampled', 0)}"
            f" | {d.get('skipped_guard', 0)} / {d.get('skipped_load_parity', 0)}"
            f" / {d.get('skipped_cap', 0)}"
            f" | {dash(r['guard_rate_end'])}"
            f" | {r['candidate_sent']} ({r['candidate_ok']})"
            f" | {ms(r['candidate_ttft_p50_s'])}"
            f" | {dash(r['inflight_incumbent_median'])}, {dash(r['inflight_candidate_median'])}"
            f" / {dash(r['inflight_candidate_max'])} |"
        )


def times(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "-"


def dash(value: Any) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per segment")
    parser.add_argument("--repeat", type=int, default=2, help="rounds (rotated order)")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument(
        "--cpus", default=None, help="CPUs both engines share (default: all of them)"
    )
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        parser.error(f"unknown --configs {unknown}: choose from {', '.join(CONFIGS)}")
    try:
        cpu = vllm_cpu.check_machine()
    except vllm_cpu.EngineUnavailable as exc:
        sys.exit(f"bench/interference.py: {exc}")
    lay = vllm_cpu.layout()
    if not vllm_cpu.venv_ready(lay):
        sys.exit(
            f"bench/interference.py: no vllm-cpu venv at {lay.venv}: run"
            " `shadow-ab engine vllm prepare` first"
        )
    cpus = vllm_cpu.check_cpus(args.cpus or vllm_cpu.all_cpus())
    mix = TrafficMix.uniform(max_tokens=args.max_tokens, model=vllm_cpu.SERVED_MODEL)
    say(
        f"bench/interference.py: vLLM bf16 (incumbent) and fp32 (candidate) both on CPUs {cpus}"
        f" ({os.cpu_count()} CPUs, {cpu.kernels} kernels); {args.concurrency} clients,"
        f" {args.duration:g}s per segment, {args.repeat} rounds; load average"
        f" {os.getloadavg()[0]:.2f}"
    )
    specs = [
        EngineSpec("bfloat16", cpus, f"bench-bf16-{os.getpid()}"),
        EngineSpec("float32", cpus, f"bench-fp32-{os.getpid()}"),
    ]
    started = time.monotonic()
    segments: dict[str, Segment] = {n: Segment() for n in names}
    with vllm_cpu.running_vllms(specs) as (inc, cand):
        say(f"  engines healthy in {time.monotonic() - started:.0f}s; warming up ...")
        for engine in (inc, cand):
            asyncio.run(traffic(engine.base_url, mix, args.concurrency, 5.0))
        for round_no in range(args.repeat):
            order = names[round_no % len(names) :] + names[: round_no % len(names)]
            say(f"round {round_no + 1}: {', '.join(order)}")
            for name in order:
                wait_idle(cand)
                wait_idle(inc)
                run_segment(name, inc, cand, mix, args, segments[name])
    rows = table(segments)
    print(
        f"\nincumbent bf16 + candidate fp32, both on CPUs {cpus}; {args.concurrency} clients,"
        f" streaming greedy chat, max_tokens {args.max_tokens}; {args.repeat} x"
        f" {args.duration:g}s per config; load average after {os.getloadavg()[0]:.2f}\n"
    )
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2, default=str))


if __name__ == "__main__":
    main()
