"""The simulated model's answers: pure functions, tested with plain values."""

from __future__ import annotations

import math
import random

import pytest

from simulator.generate import (
    NEAR_TIE_GAP,
    TOP_K_MAX,
    Departure,
    answer_length,
    apply_stops,
    complete,
    decode,
    logprobs_profile,
    natural_length,
    next_state,
    prompt_state,
    ranked,
    top_choice,
)
from simulator.vocab import ID_OFFSET, PIECES

START = prompt_state("m", "Tell me about rivers.", 7)


def test_reference_is_a_function_of_model_prompt_and_seed() -> None:
    a, _ = decode(START, 40, top_k=None)
    b, _ = decode(prompt_state("m", "Tell me about rivers.", 7), 40, top_k=None)
    assert [t.id for t in a] == [t.id for t in b]
    for other in (
        prompt_state("m2", "Tell me about rivers.", 7),
        prompt_state("m", "Tell me about lakes.", 7),
        prompt_state("m", "Tell me about rivers.", 8),
    ):
        c, _ = decode(other, 40, top_k=None)
        assert [t.id for t in c] != [t.id for t in a]


def test_fast_path_equals_full_path_and_greedy_takes_the_top_candidate() -> None:
    fast, _ = decode(START, 60, top_k=None)
    full, _ = decode(START, 60, top_k=TOP_K_MAX)
    assert [t.id for t in fast] == [t.id for t in full]
    for t in full:
        assert len(t.top) == TOP_K_MAX
        assert t.top[0] == (t.text, t.logprob)
        lps = [lp for _, lp in t.top]
        assert lps == sorted(lps, reverse=True)
        assert sum(math.exp(lp) for lp in lps) < 1.0
        assert len({s for s, _ in t.top}) == TOP_K_MAX


def test_ranked_and_top_choice_agree() -> None:
    for s in range(200):
        assert ranked(s)[0] == top_choice(s)
        assert ranked(s, 5) == ranked(s)[:5]
        assert logprobs_profile(s, 3) == logprobs_profile(s)[:3]
        assert len(logprobs_profile(s)) == TOP_K_MAX


def test_logprobs_do_not_depend_on_how_many_alternatives_are_asked() -> None:
    few, _ = decode(START, 30, top_k=2)
    none, _ = decode(START, 30, top_k=0)
    many, _ = decode(START, 30, top_k=TOP_K_MAX)
    for a, b, c in zip(few, none, many, strict=True):
        assert a.id == b.id == c.id
        assert a.logprob == b.logprob == c.logprob
        assert a.top == c.top[:2] and b.top == ()


def test_vocabulary_pieces_are_distinct() -> None:
    assert len(set(PIECES)) == len(PIECES) > 200


@pytest.mark.parametrize("pos", [0, 5, 29])
def test_near_tie_departure_swaps_the_top_two(pos: int) -> None:
    ref, _ = decode(START, 30, top_k=TOP_K_MAX)
    cand, info = decode(START, 30, top_k=TOP_K_MAX, departure=Departure(pos, near_tie=True))
    # At the first position from ``pos`` on where the reference's top two are within
    # NEAR_TIE_GAP nats (a near tie by margin, too).
    assert info is not None and info.position >= pos and info.near_tie
    pos = info.position
    assert [t.id for t in cand[:pos]] == [t.id for t in ref[:pos]]
    r, c = ref[pos], cand[pos]
    assert r.top[0][1] - r.top[1][1] <= NEAR_TIE_GAP
    assert c.text != r.text
    assert c.text == r.top[1][0]  # the runner-up of the reference
    assert r.text == c.top[1][0]  # and the reference's token is the candidate's runner-up
    assert 0 < c.top[0][1] - c.top[1][1] <= 0.0201
    assert info.reference_token == r.text and info.token == c.text


@pytest.mark.parametrize("pos", [0, 11])
def test_clear_departure_is_outside_both_top_k(pos: int) -> None:
    ref, _ = decode(START, 30, top_k=TOP_K_MAX)
    cand, info = decode(START, 30, top_k=TOP_K_MAX, departure=Departure(pos, near_tie=False))
    assert info is not None and not info.near_tie
    ref_top = {s for s, _ in ref[pos].top}
    cand_top = {s for s, _ in cand[pos].top}
    assert cand[pos].text not in ref_top
    assert ref[pos].text not in cand_top
    assert cand[pos].top[0] == (cand[pos].text, cand[pos].logprob)


def test_sampling_is_seeded_and_stays_within_the_candidates() -> None:
    a, _ = decode(START, 50, top_k=TOP_K_MAX, temperature=0.8, rng=random.Random("s:1"))
    b, _ = decode(START, 50, top_k=TOP_K_MAX, temperature=0.8, rng=random.Random("s:1"))
    c, _ = decode(START, 50, top_k=TOP_K_MAX, temperature=0.8, rng=random.Random("s:2"))
    assert [t.id for t in a] == [t.id for t in b]
    assert [t.id for t in a] != [t.id for t in c]
    for t in a:
        assert t.text in {s for s, _ in t.top}
        assert (t.text, t.logprob) in t.top
    greedy, _ = decode(START, 50, top_k=None)
    assert [t.id for t in a] != [t.id for t in greedy]


def test_stops_cut_the_text_and_the_pieces_together() -> None:
    toks, _ = decode(START, 40, top_k=None)
    text = "".join(t.text for t in toks)
    stop = toks[10].text.strip()[:3] or toks[10].text
    at = text.find(stop)
    kept, hit = apply_stops(toks, [stop], include_stop=False)
    assert hit == stop
    assert "".join(t.text for t in kept) == text[:at]
    assert all(t.text for t in kept)
    kept2, _ = apply_stops(toks, [stop], include_stop=True)
    assert "".join(t.text for t in kept2) == text[: at + len(stop)]
    same, none = apply_stops(toks, ["\x00never"], include_stop=False)
    assert same == toks and none is None


def test_stop_spanning_two_pieces_trims_the_earlier_piece() -> None:
    toks, _ = decode(START, 40, top_k=None)
    text = "".join(t.text for t in toks)
    boundary = len(toks[3].text) + sum(len(t.text) for t in toks[:3])
    stop = text[boundary - 2 : boundary + 2]
    kept, hit = apply_stops(toks, [stop], include_stop=False)
    assert hit == stop
    assert "".join(t.text for t in kept) == text[: text.find(stop)]


def test_answer_length_and_finish_reasons() -> None:
    assert answer_length(30, None, 0, False, 4096) == (30, "stop")
    assert answer_length(30, 10, 0, False, 4096) == (10, "length")
    assert answer_length(30, 30, 0, False, 4096) == (30, "stop")
    assert answer_length(30, None, 40, False, 4096) == (40, "stop")
    assert answer_length(30, 100, 0, True, 4096) == (100, "length")
    assert answer_length(5000, None, 0, False, 100) == (100, "length")


def test_complete_counts_and_visibility() -> None:
    n = natural_length(START, 24, 60)
    assert 24 <= n <= 60
    c = complete(START, natural=n, max_tokens=None, departure=Departure(3, True))
    assert c.finish_reason == "stop" and len(c.tokens) == n
    assert c.visible_departure and c.departure is not None
    assert c.text == "".join(t.text for t in c.tokens)
    short = complete(START, natural=n, max_tokens=5, departure=Departure(10, True))
    assert short.departure is None and short.finish_reason == "length" and len(short.tokens) == 5


def test_kernels_flip_is_a_near_tie_that_rejoins() -> None:
    """quality.kernels: one token flipped where the reference's top two are within max_gap,
    then the reference goes on (same length, every other token equal)."""
    from simulator.generate import top_gap

    for seed in range(20):
        start = prompt_state("m", f"kernels {seed}", 1)
        ref, _ = decode(start, 30, top_k=5)
        flip, info = decode(start, 30, top_k=5, departure=Departure(seed, True, rejoin=True))
        assert info is not None and info.position >= seed and info.near_tie
        assert len(flip) == len(ref)
        differ = [i for i, (a, b) in enumerate(zip(ref, flip, strict=True)) if a.text != b.text]
        assert differ == [info.position]
        assert ref[info.position].top[1][0] == flip[info.position].text  # the runner-up
        gap = ref[info.position].top[0][1] - ref[info.position].top[1][1]
        assert gap <= NEAR_TIE_GAP
        state = start
        for t in ref[: info.position]:
            state = next_state(state, t.id - ID_OFFSET)
        assert top_gap(state) == pytest.approx(gap)


def test_truncate_knob_validates_its_range() -> None:
    from simulator.scenario import ScenarioError, resolve

    ok = resolve({"quality": {"truncate": {"p": 0.3, "finish": "stop"}}}, "trtllm")
    assert ok.quality.truncate.finish == "stop" and ok.quality.kernels.p == 0.0
    with pytest.raises(ScenarioError, match="keep_max"):
        resolve({"quality": {"truncate": {"keep_min": 0.8, "keep_max": 0.5}}}, "vllm")
    with pytest.raises(ScenarioError, match="unknown key"):
        resolve({"quality": {"kernel": {"p": 0.1}}}, "vllm")
