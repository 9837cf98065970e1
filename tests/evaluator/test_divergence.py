"""Per-pair divergence on hand-made pairs and on the simulator's own departures (near ties by
logprob margin), and the margin read from real vLLM 0.32 answers and the simulator's
TensorRT-LLM flavor."""

from __future__ import annotations

from pathlib import Path

import orjson
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
from mirror.trace import Outcome, chat_logprobs, completion_logprobs, parse_body, stream_trace
from shadow_ab.records import TokenLogprob
from simulator.generate import NEAR_TIE_GAP, Departure, Token, decode, prompt_state
from simulator.wire import Framer

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
    # A near tie departs at the first position at or after the drawn one where the reference's
    # top two are within NEAR_TIE_GAP nats (a near tie by margin, too).
    assert d.diverged and d.first_divergence == info.position
    assert info.position == position if not near else info.position >= position
    assert d.near_tie is near
    assert d.margin is not None and (d.margin <= NEAR_TIE_GAP if near else d.margin > 0.5)
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


def test_margin_from_one_side_only() -> None:
    # The mirror asks only the candidate (and the replay) for logprobs: the incumbent has none.
    cand = [
        TokenLogprob(token="The", logprob=-0.1, top={"The": -0.1}),
        TokenLogprob(token=" dog", logprob=-0.7, top={" dog": -0.7, " cat": -0.9, " cow": -4.0}),
        TokenLogprob(token=" ran", logprob=-0.2, top={" ran": -0.2}),
    ]
    d = compare_pair(side("The cat sat"), side("The dog ran", logprobs=cand))
    assert d.token_basis == "text" and d.first_divergence == 1
    assert d.margin == pytest.approx(0.2) and not d.margin_bound and d.near_tie is True
    assert (
        compare_pair(
            side("The cat sat"), side("The dog ran", logprobs=cand), near_tie_nats=0.1
        ).near_tie
        is False
    )
    # The incumbent's token is not among the alternatives: at least 3.3 nats, a hard divergence.
    d = compare_pair(side("The bird sat"), side("The dog ran", logprobs=cand))
    assert d.margin == pytest.approx(3.3) and d.margin_bound and d.near_tie is False
    # A bound within the near-tie margin decides nothing.
    short = [
        cand[0],
        TokenLogprob(token=" dog", logprob=-0.7, top={" dog": -0.7, " cow": -0.9}),
        cand[2],
    ]
    d = compare_pair(side("The bird sat"), side("The dog ran", logprobs=short))
    assert d.margin_bound and d.near_tie is None


def test_a_token_below_its_alternative_is_no_near_tie() -> None:
    # The side's own token trails the other's by 1.5 nats in its own logprobs: it was not its
    # greedy choice (penalties, or logprobs before processing), so the margin is unknown and
    # the divergence counts as hard, never as a tie at 0.
    cand = [
        TokenLogprob(token="The", logprob=-0.1, top={"The": -0.1}),
        TokenLogprob(token=" dog", logprob=-2.0, top={" dog": -2.0, " cat": -0.5}),
        TokenLogprob(token=" ran", logprob=-0.2, top={" ran": -0.2}),
    ]
    d = compare_pair(side("The cat sat"), side("The dog ran", logprobs=cand))
    assert d.margin is None and d.near_tie is None
    # A tie within float rounding is still a tie.
    cand[1] = TokenLogprob(token=" dog", logprob=-0.50001, top={" dog": -0.50001, " cat": -0.5})
    d = compare_pair(side("The cat sat"), side("The dog ran", logprobs=cand))
    assert d.margin == 0.0 and d.near_tie is True


def test_a_longer_token_on_the_other_side_is_judged_where_it_was_chosen() -> None:
    # The candidate chose " the" where the incumbent chose " then": the texts first differ just
    # after the candidate's token, but the choice was that token against " then".
    cand = [
        TokenLogprob(token="Say", logprob=-0.1, top={"Say": -0.1}),
        TokenLogprob(token=" the", logprob=-0.6, top={" the": -0.6, " then": -0.7, " th": -2.0}),
        TokenLogprob(token="m", logprob=-0.1, top={"m": -0.1, "n": -5.0}),
    ]
    d = compare_pair(side("Say then"), side("Say them", logprobs=cand))
    assert d.margin == pytest.approx(0.1) and not d.margin_bound and d.near_tie is True


def test_margin_is_the_larger_sides() -> None:
    inc = lps(["The", " cat", " sat"], [{"The": -0.1}, {" cat": -0.1, " dog": -0.2}, {}])
    oth = [
        TokenLogprob(token="The", logprob=-0.1, top={"The": -0.1}),
        TokenLogprob(token=" dog", logprob=-0.1, top={" dog": -0.1, " cat": -1.6}),
        TokenLogprob(token=" ran", logprob=-0.1, top={}),
    ]
    d = compare_pair(side("The cat sat", logprobs=inc), side("The dog ran", logprobs=oth))
    assert d.margin == pytest.approx(1.5) and d.near_tie is False


def test_margin_unknown_where_a_side_ended_or_tokens_do_not_spell_the_text() -> None:
    cand = lps(["The", " cat", " sat", " down"], [{}, {}, {}, {" down": -0.1, "!": -0.2}])
    d = compare_pair(side("The cat sat"), side("The cat sat down", logprobs=cand))
    assert d.diverged and d.margin is None and d.near_tie is None  # the incumbent ended there
    bytes_tokens = lps(["The", " c", "bytes:\\x61", "t"], [{}, {}, {"x": -0.1, "y": -0.2}, {}])
    d = compare_pair(side("The cow"), side("The cat", logprobs=bytes_tokens))
    assert d.margin is None


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0"


def _fixture_outcome(name: str, chat: bool) -> Outcome:
    raw = orjson.loads((FIXTURES / f"{name}.json").read_bytes())
    if "sse" in raw:
        body = "".join(e + "\n\n" for e in raw["sse"]).encode()
        return stream_trace([(1.0, body)], 0.0, chat=chat).outcome()
    return parse_body(orjson.dumps(raw["json"]), chat=chat, e2e_s=1.0)


@pytest.mark.parametrize(
    ("name", "chat"),
    [
        ("chat-logprobs", True),
        ("chat-stream-logprobs", True),
        ("cmpl-logprobs", False),
        ("cmpl-stream-logprobs", False),
    ],
)
def test_margin_on_real_vllm_answers(name: str, chat: bool) -> None:
    """Real vLLM 0.32 answers (recorded): the tokens spell the text, the sampled token leads its
    alternatives, and a departure to the runner-up is judged by the recorded gap."""
    out = _fixture_outcome(name, chat)
    assert out.output_text and out.logprobs
    assert "".join(t.token for t in out.logprobs) == out.output_text
    j = 1
    chosen = out.logprobs[j]
    runner = max((v, t) for t, v in chosen.top.items() if t != chosen.token)
    prefix = "".join(t.token for t in out.logprobs[:j])
    other = prefix + runner[1] + " and more"
    assert not out.output_text.startswith(prefix + runner[1])
    d = compare_pair(side(other), side(out.output_text, logprobs=out.logprobs))
    assert d.margin == pytest.approx(chosen.logprob - runner[0]) and not d.margin_bound
    assert d.near_tie is (d.margin <= 0.5)


@pytest.mark.parametrize("chat", [True, False])
def test_margin_on_the_simulators_tensorrt_llm_answers(chat: bool) -> None:
    """The simulator's TensorRT-LLM flavor frames logprobs its own way (no sampled token first,
    completions' top_logprobs a plain dict): the mirror's parser and the margin read it too."""
    start = prompt_state("sim", "a prompt", 3)
    ref, _ = decode(start, 24, top_k=5)
    dep, info = decode(start, 24, top_k=5, departure=Departure(6, True))
    assert info is not None
    framer = Framer("trtllm", "chat" if chat else "completions", "m", stream=False, seq_no=1)
    if chat:
        parsed = chat_logprobs(framer.chat_logprobs(dep, 5))
    else:
        parsed = completion_logprobs(framer.completion_logprobs(dep, 5, 0))
    text = "".join(t.text for t in dep)
    assert "".join(t.token for t in parsed) == text
    d = compare_pair(side("".join(t.text for t in ref)), side(text, logprobs=parsed))
    assert d.first_divergence is not None and d.near_tie is True
    assert d.margin is not None and d.margin <= NEAR_TIE_GAP
