"""What bounding the sinks' queues in bytes costs on the mirror's path, and how close it counts.

    python bench/sink_bounds.py [--repeat R]

``submit`` now measures each record with ``storage.bounds.approx_bytes`` (lengths of its texts
and lists, no encoding) and keeps a ledger of accepted records in a memory-mapped file. For
records as the mirror makes them -- small (a short chat, 40 ITL floats), typical (1-4 KB of
text, 300 ITL floats), large (a 2 MB prompt) and with logprobs (500 tokens, top-5) -- it prints,
side by side in this process: the time of ``approx_bytes`` and of a ledger ``accept``, as a
ratio to encoding the record (``to_json``, which the sink's thread does anyway), and the
estimate's ratio to the real JSON size. No timing is asserted anywhere (the machine is shared).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from shadow_ab.records import ExchangeRecord, TokenLogprob
from storage.bounds import Ledger, approx_bytes


def _record(prompt: str, output: str, itl: int, logprobs: int = 0) -> ExchangeRecord:
    return ExchangeRecord(
        deployment="bench",
        pair_id=uuid.uuid4(),
        role="incumbent",
        engine="vllm@incumbent",
        endpoint="chat",
        stream=True,
        sent_at=datetime.now(UTC),
        status="ok",
        ttft_s=0.05,
        e2e_s=1.2,
        itl_s=[0.0123456] * itl,
        request={
            "model": "m",
            "messages": [
                {"role": "system", "content": "You are helpful."},
                {"role": "user", "content": prompt},
            ],
            "max_tokens": 512,
            "temperature": 0.7,
            "stream": True,
        },
        output_text=output,
        logprobs=[
            TokenLogprob(token=f"tok{i}", logprob=-0.5, top={f"alt{k}": -1.0 for k in range(5)})
            for i in range(logprobs)
        ]
        or None,
    )


CASES = {
    "small": _record("hello " * 10, "word " * 40, 40),
    "typical": _record("word " * 300, "word " * 400, 300),
    "large (2 MB prompt)": _record("x" * 2_000_000, "word " * 400, 300),
    "logprobs (500 x top-5)": _record("word " * 300, "word " * 500, 500, logprobs=500),
}


def _time(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of one call over ``repeat`` rounds of enough calls to last ~20 ms."""
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - start > 0.02:
            break
        n *= 2
    rounds = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - start) / n)
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(Path(tmp) / "ledger")
        print(
            f"{'record':24} {'JSON bytes':>11} {'estimate/JSON':>14} {'to_json µs':>11}"
            f" {'approx/to_json':>15} {'ledger/to_json':>15}"
        )
        for name, rec in CASES.items():
            size = len(rec.to_json())
            t_json = _time(rec.to_json, args.repeat)
            t_approx = _time(lambda rec=rec: approx_bytes(rec), args.repeat)
            t_ledger = _time(ledger.accept, args.repeat)
            print(
                f"{name:24} {size:>11,} {approx_bytes(rec) / size:>14.2f} {t_json * 1e6:>11.1f}"
                f" {t_approx / t_json:>15.3f} {t_ledger / t_json:>15.4f}"
            )
        ledger.close()


if __name__ == "__main__":
    main()
