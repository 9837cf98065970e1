"""Per-pair divergence on hand-made pairs and on the simulator's own departures (near ties)."""

from __future__ import annotations

import pytest
from factories import exchange

from evaluator.compare import (
    PairSide,
    compare_pair,
    first_difference,
    json_asked,
    near_tie_at,
    text_tokens,
)
from shadow_ab.records import TokenLogprob
from simulator.generate import Departure, Token, decode, prompt_state

GREEDY = {"temperature": 0.0, "max_tokens": 64}


def side(text: str | None, **kw: object) -> PairSide:
    kw.setdefault("request", GREEDY)
    kw.setdefault("finish_reason", "stop")
    return PairSide(text=text, **kw)  # type: ignore[arg-type]  # test shorthand


def lps(tokens: list[str], tops: list[dict[str, float]] | None = None) -> list[TokenLogprob]:
    tops = tops or [{t: -0.1} for t in tokens]
    return [
        TokenLogprob(token=t, logprob=-0.1, top=top) for t, top in zip(tokens, tops, strict=True)
    ]


def test_identical_greedy_answers_match() -> None:
    d = compare_pair(side("The capital is Paris."), side("The capital is Paris."))
    assert d.comparable and d.greedy and d.exact_match is True and not d.diverged
    assert d.edit_similarity == 1.0 and d.first_divergence is None
    assert d.finish_mismatch is False and d.token_basis == "text"


def test_text_divergence_position_and_similarity() -> None:
    a, b = "The capital of France is Paris.", "The capital of France is Lyon, I think."
    d = compare_pair(side(a), side(b))
    assert d.diverged and d.exact_match is False
    assert d.first_divergence == 5  # The capital of France is | Paris
    assert d.divergent_tokens == ("Paris", "Lyon")
    # Paris->Lyon, then ", I think" inserted: 4 edits over the longer side's 10 tokens.
    assert d.edit_similarity == pytest.approx(1 - 4 / 10)
    assert d.near_tie is None  # no logprobs: unknown


def test_prefix_and_length_ratio_and_finish() -> None:
    d = compare_pair(
        side("one two three", completion_tokens=3, finish_reason="stop"),
        side("one two three four five six", completion_tokens=6, finish_reason="length"),
    )
    assert d.first_divergence == 3 and d.divergent_tokens == (None, "four")
    assert d.length_ratio == 2.0
    assert d.finish_mismatch is True and d.finish_reasons == ("stop", "length")


def test_sampled_pairs_are_not_judged_on_exact_match() -> None:
    sampled = {"temperature": 0.7}
    d = compare_pair(side("a b c", request=sampled), side("a b d", request=sampled))
    assert d.comparable and not d.greedy
    assert d.exact_match is None and not d.diverged
    assert d.edit_similarity == pytest.approx(2 / 3)
    assert not PairSide(text="x", request={}).greedy  # absent temperature means 1.0


def test_failed_side_is_not_comparable() -> None:
    d = compare_pair(side("fine"), side(None, status="http_error"))
    assert not d.comparable and d.edit_similarity is None and not d.diverged


def test_json_validity_when_json_was_asked() -> None:
    req = {"temperature": 0.0, "response_format": {"type": "json_object"}}
    assert json_asked(req) and not json_asked(GREEDY)
    d = compare_pair(side('{"a": 1}', request=req), side('{"a": 1', request=req))
    assert d.json_asked and d.json_valid_incumbent is True and d.json_valid_other is False
    assert compare_pair(side("{}"), side("{")).json_valid_other is None  # not asked


def test_near_tie_each_token_in_the_others_top_k() -> None:
    inc = lps(["The", " cat", " sat"], [{"The": -0.1}, {" cat": -0.50, " dog": -0.52}, {}])
    near = lps(["The", " dog", " ran"], [{"The": -0.1}, {" dog": -0.50, " cat": -0.51}, {}])
    d = compare_pair(side("The cat sat", logprobs=inc), side("The dog ran", logprobs=near))
    assert d.token_basis == "logprobs" and d.first_divergence == 1 and d.near_tie is True

    one_way = lps(["The", " dog", " ran"], [{"The": -0.1}, {" dog": -0.1, " bird": -3.0}, {}])
    d = compare_pair(side("The cat sat", logprobs=inc), side("The dog ran", logprobs=one_way))
    assert d.near_tie is False  # " cat" is not among the candidate's alternatives

    bare = lps(["The", " dog", " ran"], [{"The": -0.1}, {}, {}])
    assert near_tie_at(inc, bare, 1) is None  # no alternatives kept: unknown
    assert near_tie_at(inc, bare, 7) is None


def test_logprob_tokens_used_only_when_both_sides_have_them() -> None:
    inc = lps(["Hel", "lo", " world"])
    d = compare_pair(side("Hello world", logprobs=inc), side("Hello there"))
    assert d.token_basis == "text" and d.first_divergence == 1


def _as_logprobs(tokens: list[Token]) -> list[TokenLogprob]:
    return [TokenLogprob(token=t.text, logprob=t.logprob, top=dict(t.top)) for t in tokens]


@pytest.mark.parametrize("near", [True, False])
@pytest.mark.parametrize("seed", range(5))
def test_simulator_departures_are_judged_as_injected(seed: int, near: bool) -> None:
    start = prompt_state("sim-llama", f"prompt {seed}", 7)
    position = 3 + 4 * seed
    ref, _ = decode(start, 40, top_k=5)
    dep, info = decode(start, 40, top_k=5, departure=Departure(position, near))
    assert info is not None
    text_a = "".join(t.text for t in ref)
    text_b = "".join(t.text for t in dep)
    d = compare_pair(
        side(text_a, logprobs=_as_logprobs(ref)), side(text_b, logprobs=_as_logprobs(dep))
    )
    assert d.diverged and d.first_divergence == position
    assert d.near_tie is near
    assert d.divergent_tokens == (info.reference_token, info.token)


def test_long_outputs_compare_on_tokens() -> None:
    words = [f"w{i % 97}" for i in range(20_000)]
    changed = list(words)
    changed[15_000] = "other"
    d = compare_pair(side(" ".join(words)), side(" ".join(changed)))
    assert d.first_divergence == 15_000
    assert d.edit_similarity == pytest.approx(1 - 1 / 20_000)


def test_from_record_and_from_row() -> None:
    rec = exchange(
        role="candidate",
        request={"temperature": 0},
        output_text="a b",
        finish_reason="stop",
        completion_tokens=2,
        logprobs=lps(["a", " b"]),
    )
    s = PairSide.from_record(rec)
    assert s.greedy and s.ok and s.logprobs is not None and len(s.logprobs) == 2
    row = rec.model_dump(mode="json")
    r = PairSide.from_row(row)
    assert r.logprobs == s.logprobs and r.status == "ok" and r.text == "a b"


def test_tokenization_helpers() -> None:
    assert text_tokens("Hi, there!  ok") == ["Hi", ",", "there", "!", "ok"]
    assert first_difference(["a", "b"], ["a", "b"]) is None
    assert first_difference(["a"], ["a", "b"]) == 1
