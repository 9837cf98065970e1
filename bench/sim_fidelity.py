"""How faithfully (and how cheaply) one simulator plays its latency model under load.

    python bench/sim_fidelity.py [--flavor vllm|trtllm] [--tokens 64] [--levels 1,32,128,256]

Starts one simulator (no noise, decode 8 ms/iteration, batch slowdown 0.4%/sequence, prefill
12 ms + 0.04 ms/prompt token), opens N concurrent streaming chat requests with a raw aiohttp
SSE reader (lighter than the openai client, so the client steals less of the 2 cores), and
prints per level: the modelled inter-token latency, the measured ITL p50/p99 and their ratio to
the model, TTFT p50, tokens/s delivered, and the simulator's CPU seconds per 1000 tokens (from
/proc/<pid>/stat). A ratio near 1.0 means the simulator keeps the pace its
model sets; above 1.0 the simulator (or the client sharing its CPU) is the bottleneck.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import time

import aiohttp

from shadow_ab.dev.processes import RunningSim, running_sim

MODEL = "sim-llama-3-8b-instruct"
DECODE_MS = 8.0
SLOWDOWN = 0.004


def cpu_seconds(sim: RunningSim) -> float:
    """CPU seconds (user + system) of the serving process so far, from /proc."""
    pid = [e for e in sim.ledger() if e["event"] == "start"][-1]["pid"]
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_stream(
    session: aiohttp.ClientSession, url: str, tokens: int, i: int
) -> tuple[float, list[float]]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"bench {i}"}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
    }
    sent = time.perf_counter()
    ttft = float("nan")
    stamps: list[float] = []
    async with session.post(url, json=body) as resp:
        resp.raise_for_status()
        buf = b""
        async for data in resp.content.iter_any():
            buf += data
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if b'"content":"' in event and b'"content":""' not in event:
                    now = time.perf_counter()
                    if not stamps:
                        ttft = now - sent
                    stamps.append(now)
    return ttft, [b - a for a, b in itertools.pairwise(stamps)]


async def level(sim: RunningSim, n: int, tokens: int) -> dict[str, float]:
    url = sim.v1 + "/chat/completions"
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:
        cpu0 = cpu_seconds(sim)
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one_stream(session, url, tokens, i) for i in range(n)))
        wall = time.perf_counter() - t0
        cpu1 = cpu_seconds(sim)
    itls = sorted(g for _, gaps in results for g in gaps)
    ttfts = sorted(t for t, _ in results)
    model_itl = DECODE_MS * (1 + SLOWDOWN * (n - 1)) / 1000.0
    total = n * tokens
    return {
        "n": n,
        "model_itl_ms": model_itl * 1000,
        "itl_p50_ms": statistics.median(itls) * 1000,
        "itl_p99_ms": itls[int(0.99 * (len(itls) - 1))] * 1000,
        "ratio_p50": statistics.median(itls) / model_itl,
        "ttft_p50_ms": statistics.median(ttfts) * 1000,
        "tok_s": total / wall,
        "cpu_s_per_1k_tok": (cpu1 - cpu0) / total * 1000,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--flavor", default="vllm", choices=["vllm", "trtllm"])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--levels", default="1,32,128,256")
    args = ap.parse_args()
    overrides = {
        "latency": {"decode_ms": DECODE_MS, "batch_slowdown": SLOWDOWN, "noise": 0.0},
        "answers": {"min_tokens": args.tokens, "max_tokens": args.tokens},
    }
    with running_sim(args.flavor, "clean", overrides=overrides) as sim:
        rows = [asyncio.run(level(sim, int(n), args.tokens)) for n in args.levels.split(",")]
    cols = [
        "n",
        "model_itl_ms",
        "itl_p50_ms",
        "itl_p99_ms",
        "ratio_p50",
        "ttft_p50_ms",
        "tok_s",
        "cpu_s_per_1k_tok",
    ]
    print(f"flavor {args.flavor}, {args.tokens} tokens per stream, decode {DECODE_MS} ms")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print(
            "| "
            + " | ".join(f"{r[c]:.0f}" if c in ("n", "tok_s") else f"{r[c]:.3f}" for c in cols)
            + " |"
        )


if __name__ == "__main__":
    main()
