"""What the privacy step costs per record (mirror/privacy.py, run in the mirror's event loop
after the client's answer is complete), side by side with what every record costs anyway.

    python bench/privacy_cost.py [--repeat 5] [--sizes 1000,4000,16000,64000]

Builds pairs of exchange records whose prompt is prose of the given size in characters (with an
e-mail address, a phone number or some figures every ~50 words, as chat prompts have) and
three records per pair (incumbent, candidate, replay: one prompt, each its own ~1 KB answer), as
the mirror makes them, every pair new (so the redactor's per-pair memory of the prompt helps as
it does in the mirror, and no more); then times, interleaved and repeated, in CPU time of this
process:

- `to_json`: encoding the record, which every sink does for every record (the yardstick);
- `full + builtin`: capture full with the built-in redactor (the default);
- `full, no redactor`: capture full with `redactor: none` (credential keys only);
- `metadata`: keyed digests instead of text;
- `none`: parameters only.

Prints µs per record (median of the repeats) and the ratio to `to_json`, so the figures read the
same on a loaded machine.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import uuid
from collections.abc import Callable

from mirror.privacy import Privacy, PrivacyConfig
from shadow_ab.records import ExchangeRecord

WORDS = (
    "the model should answer in a short paragraph about the shipment order invoice customer"
    " account balance delivery address weather report summary figures table"
).split()
PRIVATE = [
    "write to jane.doe@example.com",
    "call +1 415 555 2671",
    "order 12345678 of 2026-11-30",
    "total 1,234.50 EUR",
]


def prose(n: int, rng: random.Random) -> str:
    out: list[str] = []
    size = 0
    while size < n:
        piece = rng.choice(PRIVATE) if rng.random() < 0.02 else rng.choice(WORDS)
        out.append(piece)
        size += len(piece) + 1
    return " ".join(out)[:n]


def pair(n: int, rng: random.Random) -> list[ExchangeRecord]:
    """Three records of one pair: one prompt, three answers."""
    prompt = prose(n, rng)
    return [record(prompt, role, rng) for role in ("incumbent", "candidate", "replay")]


def record(prompt: str, role: str, rng: random.Random) -> ExchangeRecord:
    return ExchangeRecord.model_validate(
        {
            "deployment": "bench",
            "pair_id": str(uuid.uuid4()),
            "role": role,
            "engine": f"engine@{role}",
            "endpoint": "chat",
            "stream": True,
            "sent_at": "2026-12-01T00:00:00Z",
            "status": "ok",
            "request": {
                "model": "m",
                "messages": [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": prompt},
                ],
                "temperature": 0,
                "max_tokens": 256,
                "user": "customer-42",
            },
            "output_text": prose(1000, rng),
            "completion_tokens": 200,
        }
    )


def cpu_us(fn: Callable[[ExchangeRecord], object], records: list[ExchangeRecord]) -> float:
    t = time.process_time()
    for rec in records:
        fn(rec)
    return (time.process_time() - t) / len(records) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--sizes", default="1000,4000,16000,64000")
    args = parser.parse_args()
    rng = random.Random(14)
    cases: dict[str, tuple[Privacy | None, str]] = {
        "to_json": (None, ""),
        "full + builtin": (Privacy(PrivacyConfig(capture="full")), "full"),
        "full, no redactor": (Privacy(PrivacyConfig(capture="full", redactor="none")), "full"),
        "metadata": (Privacy(PrivacyConfig(capture="metadata")), "metadata"),
        "none": (Privacy(PrivacyConfig(capture="none")), "none"),
    }
    print("| prompt chars | case | µs per record (median) | ratio to to_json |")
    print("|---|---|---|---|")
    for size in (int(s) for s in args.sizes.split(",")):
        n_pairs = max(70, 300_000 // size)  # more pairs than the redactor remembers
        runs: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.repeat):
            for name, (privacy, level) in cases.items():
                # Fresh pairs for every case and repeat, so none finds another's prompts.
                records = [r for _ in range(n_pairs) for r in pair(size, rng)]
                if privacy is None:
                    runs[name].append(cpu_us(lambda r: r.to_json(), records))
                else:
                    p, lv = privacy, level
                    runs[name].append(cpu_us(lambda r, p=p, lv=lv: p.apply(r, lv), records))
        base = statistics.median(runs["to_json"])
        for name in cases:
            med = statistics.median(runs[name])
            print(f"| {size:,} | {name} | {med:,.0f} | {med / base:.2f} |")


if __name__ == "__main__":
    main()
