"""Answers whose quality can be checked: probes, JSON, refusals (issue 12's ``quality`` knobs).

The simulator's ordinary answers are a deterministic chain of vocabulary pieces; a quality check
needs more. :class:`QualityAnswers` answers, before that chain:

- a **probe** (a chat request whose last user message is a prompt of the probe set,
  ``quality.probe_set``, default the shipped one): correctly with probability
  ``quality.probe_accuracy``, else :meth:`shadow_ab.probes.Probe.wrong_answer` (well formed,
  wrong); a JSON probe's answer is then broken with probability ``quality.broken_json``;
- with ``quality.json_answers``, a request that asks for **JSON** (``response_format``
  ``json_object`` / ``json_schema``): a valid instance of its schema (``{"answer": ...}``
  without one), broken (cut in half: not JSON) with probability ``quality.broken_json``;
- any other answer is replaced by a **refusal** sentence with probability
  ``quality.refusal``.

Each draw is written to the ledger (``probe`` lines: ``probe_id``, ``correct``, ``accuracy``;
``json`` lines: ``broken``; ``refusal`` lines), so a test knows what was injected.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

import orjson

from shadow_ab.probes import REFUSAL_TEXT, ProbeSet, example_of, json_asked, load_probe_set
from simulator.generate import Completion, Token

_PIECE_RE = re.compile(r"\S+\s*|\s+")


@dataclass(frozen=True)
class QualityAnswer:
    text: str
    event: str
    """The ledger event: ``probe``, ``json`` or ``refusal``."""
    fields: dict[str, Any]


def broken(text: str) -> str:
    """JSON cut in half (what an engine whose structured output fails sends): never valid."""
    cut = text[: max(1, len(text) // 2)]
    return cut if cut != text else text + "{"


class QualityAnswers:
    """The ``quality`` knobs of one simulator (see the module docstring)."""

    def __init__(self, knobs: Any, rng: random.Random) -> None:
        self.knobs = knobs
        self.rng = rng
        self._probes: ProbeSet | None = None

    @property
    def probes(self) -> ProbeSet:
        if self._probes is None:
            self._probes = load_probe_set(self.knobs.probe_set)
        return self._probes

    def answer(
        self, request: dict[str, Any], messages: list[dict[str, Any]] | None
    ) -> QualityAnswer | None:
        """The answer the knobs give ``request`` (a chat's ``messages``), or None: the
        ordinary chain answers."""
        k = self.knobs
        probe = None
        if messages:
            last = messages[-1].get("content")
            probe = self.probes.by_prompt(last) if isinstance(last, str) else None
        if probe is not None:
            correct = self.rng.random() < k.probe_accuracy
            text = probe.correct_answer() if correct else probe.wrong_answer()
            broke = probe.kind == "json" and self.rng.random() < k.broken_json
            if broke:
                text = broken(text)
            return QualityAnswer(
                text,
                "probe",
                {
                    "probe_id": self.probes.key(probe),
                    "kind": probe.kind,
                    "correct": correct and not broke,
                    "accuracy": k.probe_accuracy,
                    "broken_json": broke,
                },
            )
        asked, schema = json_asked(request)
        if asked and k.json_answers:
            value = example_of(schema) if schema else {"answer": "simulated"}
            text = orjson.dumps(value).decode()
            broke = self.rng.random() < k.broken_json
            return QualityAnswer(broken(text) if broke else text, "json", {"broken": broke})
        if k.refusal > 0 and self.rng.random() < k.refusal:
            return QualityAnswer(REFUSAL_TEXT, "refusal", {"rate": k.refusal})
        return None


def completion_of(text: str, max_tokens: int | None, top_k: int | None) -> Completion:
    """``text`` as a completion of whitespace-delimited pieces (cut at ``max_tokens``)."""
    pieces = _PIECE_RE.findall(text) or [text]
    reason = "stop"
    if max_tokens is not None and len(pieces) > max_tokens:
        pieces, reason = pieces[:max_tokens], "length"
    tokens = [
        Token(1_000 + i, p, -0.01, ((p, -0.01),) if top_k else ()) for i, p in enumerate(pieces)
    ]
    return Completion(tokens=tokens, finish_reason=reason, text="".join(pieces))
