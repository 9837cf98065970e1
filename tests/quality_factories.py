"""Records of probe and client pairs answered by the simulator's quality model (the answers of
simulator/quality.py, in process, no HTTP): fast enough for many seeds, and its draws are the
ledger a test checks the evaluator against."""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from shadow_ab.probes import SYNTHETIC_PROBE, load_probe_set
from shadow_ab.records import ExchangeRecord
from simulator.quality import QualityAnswers
from simulator.scenario import Quality


@dataclass
class Generated:
    records: list[ExchangeRecord] = field(default_factory=list)
    ledger: list[dict[str, Any]] = field(default_factory=list)
    """One line per answer the quality model drew (role, event, its fields)."""


def _text(model: QualityAnswers, body: dict[str, Any], fallback: str) -> tuple[str, Any]:
    got = model.answer(body, body.get("messages"))
    return (got.text, got) if got is not None else (fallback, None)


def quality_pairs(
    *,
    seed: int,
    incumbent: dict[str, Any],
    candidate: dict[str, Any],
    probe_pairs: int,
    client_pairs: int = 0,
    json_share: float = 0.2,
    start: datetime,
    days: float,
    deployment: str = "dep-q",
) -> Generated:
    """``probe_pairs`` probe pairs and ``client_pairs`` client pairs (a ``json_share`` asking
    for JSON) spread uniformly over ``days`` from ``start``; each side answered by a quality
    model with the knobs ``incumbent`` / ``candidate`` (``Quality`` fields)."""
    rng = random.Random(seed)
    probes = load_probe_set()
    models = {
        "incumbent": QualityAnswers(Quality(**incumbent), random.Random(seed * 2 + 1)),
        "candidate": QualityAnswers(Quality(**candidate), random.Random(seed * 2 + 2)),
    }
    out = Generated()
    span = days * 86400.0

    def pair(body: dict[str, Any], synthetic: str | None, probe_id: str | None) -> None:
        pid = uuid.uuid4()
        sent = start + timedelta(seconds=rng.uniform(0, span))
        for role, model in models.items():
            text, drawn = _text(model, body, "A plain answer about the sea.")
            if drawn is not None:
                out.ledger.append({"role": role, "event": drawn.event, **drawn.fields})
            out.records.append(
                ExchangeRecord(
                    deployment=deployment,
                    pair_id=pid,
                    role=role,
                    engine=f"sim@{role}",
                    endpoint="chat",
                    stream=False,
                    sent_at=sent + timedelta(milliseconds=1 if role == "candidate" else 0),
                    status="ok",
                    e2e_s=0.2,
                    request=body,
                    output_text=text,
                    synthetic=synthetic,
                    probe_id=probe_id,
                )
            )

    for _ in range(probe_pairs):
        probe = rng.choice(probes.probes)
        pair(probe.request(), SYNTHETIC_PROBE, probes.key(probe))
    for i in range(client_pairs):
        body: dict[str, Any] = {
            "messages": [{"role": "user", "content": f"client question {i}"}],
            "temperature": 0,
        }
        if rng.random() < json_share:
            body["response_format"] = {"type": "json_object"}
        pair(body, None, None)
    return out
