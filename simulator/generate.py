"""What the simulated model answers: pure functions of (model, prompt, seed) and a few knobs.

The reference answer is a hash chain over the shipped vocabulary: the state after each token is
a 64-bit hash of the state before it and the token chosen, and each state ranks
:data:`TOP_K_MAX` candidate tokens with descending log-probabilities. Greedy decoding takes the
top candidate, sampling draws from the candidates with a temperature, and a *departure* (the
divergence knob) replaces the top candidate at one position, after which the chain continues
from the departed prefix. Both flavors call the same functions, so an A/A pair of greedy
requests matches exactly.

Nothing here does I/O; the server calls :func:`complete` once per choice when it admits a
request and streams the result at the pace its scheduler sets.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, field

from simulator.vocab import ID_OFFSET, PIECES, VOCAB_SIZE

TOP_K_MAX = 20
"""How many alternatives each position ranks (the most ``top_logprobs`` may ask for)."""

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_DEPART = 0xD1B54A32D192ED03
NEAR_TIE_GAP = 0.25
"""Nats: a near-tie departure happens only where the reference's top two tokens are this close
(the first such position at or after the drawn one), so it is a near tie by margin too."""
_TAIL_WEIGHT = 4.0
"""Probability mass of the rest of the vocabulary, as a multiple of the last candidate's."""


def _mix(x: int) -> int:
    """splitmix64's finalizer: a fast, well-spread 64-bit hash step."""
    x = (x + _GOLDEN) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def prompt_state(model: str, prompt: str, seed: int | None) -> int:
    """The chain's start state for one prompt."""
    digest = hashlib.blake2b(
        f"{model}\x00{prompt}\x00{seed if seed is not None else ''}".encode(), digest_size=8
    ).digest()
    return int.from_bytes(digest, "little")


def natural_length(state: int, lo: int, hi: int) -> int:
    """Where the model would emit end-of-sequence, in ``[lo, hi]`` tokens."""
    return lo + _mix(state ^ 0x5EED) % (hi - lo + 1)


def next_state(state: int, token_index: int) -> int:
    return _mix(state ^ ((token_index + 1) * _GOLDEN & _MASK))


def ranked(state: int, k: int = TOP_K_MAX, salt: int = 0) -> list[int]:
    """``k`` distinct vocabulary indexes, most probable first (a prefix of the top 20)."""
    out: list[int] = []
    seen: set[int] = set()
    x = state ^ salt
    while True:
        x = _mix(x)
        for shift in (0, 16, 32, 48):  # four draws per hash
            idx = ((x >> shift) & 0xFFFF) % VOCAB_SIZE
            if idx not in seen:
                if len(out) == k:
                    return out
                seen.add(idx)
                out.append(idx)


def top_choice(state: int) -> int:
    """``ranked(state)[0]`` without ranking the rest (the greedy fast path)."""
    return (_mix(state) & 0xFFFF) % VOCAB_SIZE


def logprobs_profile(state: int, k: int = TOP_K_MAX) -> list[float]:
    """Descending log-probabilities of the first ``k`` of the 20 ranked candidates.

    They are normalised over all 20 (plus the rest of the vocabulary), so a token's logprob is
    the same whatever ``k`` a request asks for.
    """
    x = state ^ 0x10C9
    scores = [0.0]
    s = 0.0
    while len(scores) < TOP_K_MAX:
        x = _mix(x)
        for shift in (0, 16, 32, 48):
            if len(scores) == TOP_K_MAX:
                break
            # Gaps between neighbours: mostly clear, sometimes a near tie.
            u = ((x >> shift) & 0xFFFF) / 65536.0
            s -= 0.02 + 2.5 * u * u
            scores.append(s)
    total = sum(math.exp(v) for v in scores) + _TAIL_WEIGHT * math.exp(scores[-1])
    norm = math.log(total)
    return [v - norm for v in scores[:k]]


@dataclass(frozen=True, slots=True)
class Token:
    """One generated token: its text, its logprob and the top alternatives at its position."""

    id: int
    text: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()
    """Up to :data:`TOP_K_MAX` ``(text, logprob)``, most probable first; empty if not asked."""


@dataclass(frozen=True, slots=True)
class Departure:
    """The divergence knob's decision for one greedy choice."""

    position: int
    near_tie: bool
    rejoin: bool = False
    """After the departing token, go on as the reference does (the ``kernels`` knob)."""
    max_gap: float = NEAR_TIE_GAP
    """Near ties: the largest gap (nats) between the reference's top two tokens to depart at."""


def top_gap(state: int) -> float:
    """Nats between the reference's top two tokens at ``state``."""
    lps = logprobs_profile(state, 2)
    return lps[0] - lps[1]


@dataclass(frozen=True, slots=True)
class DepartureInfo:
    """What a departure did, for the ledger."""

    position: int
    near_tie: bool
    reference_token: str
    token: str
    reference_top: tuple[str, ...]
    top: tuple[str, ...]


@dataclass(slots=True)
class Completion:
    """One choice's answer as it will be streamed."""

    tokens: list[Token]
    finish_reason: str
    stop_reason: str | None = None
    departure: DepartureInfo | None = None
    visible_departure: bool = False
    """Whether the departure survived stop-sequence truncation (it changed the output)."""
    text: str = field(default="")


def choose_departure(
    rng: random.Random,
    *,
    p: float,
    near_tie_share: float,
    length: int,
    position_min: int = 0,
    position_max: int | None = None,
) -> Departure | None:
    """The divergence knob for one greedy choice of ``length`` tokens.

    With probability ``p`` the choice departs at a position uniform in
    ``[position_min, min(position_max, length - 1)]`` (no departure if that is empty); a
    ``near_tie_share`` of departures are near ties.
    """
    if p <= 0.0 or rng.random() >= p:
        return None
    hi = length - 1 if position_max is None else min(length - 1, position_max)
    if position_min > hi:
        return None
    near = rng.random() < near_tie_share
    return Departure(rng.randint(position_min, hi), near)


def _token(idx: int, logprob: float, top: tuple[tuple[str, float], ...]) -> Token:
    return Token(ID_OFFSET + idx, PIECES[idx], logprob, top)


def decode(
    start: int,
    length: int,
    *,
    top_k: int | None,
    temperature: float = 0.0,
    rng: random.Random | None = None,
    departure: Departure | None = None,
) -> tuple[list[Token], DepartureInfo | None]:
    """Decode ``length`` tokens from ``start``: greedy unless ``rng`` and ``temperature > 0``.

    ``top_k`` (0..20) computes each token's logprob and its ``top_k`` best alternatives;
    ``None`` (no logprobs asked) takes the greedy fast path, leaving ``logprob`` at 0.0.
    """
    tokens: list[Token] = []
    info: DepartureInfo | None = None
    state = start
    sampling = rng is not None and temperature > 0.0
    k = top_k or 0
    for pos in range(length):
        if (
            departure is not None
            and info is None
            and pos >= departure.position
            and (not departure.near_tie or top_gap(state) <= departure.max_gap)
        ):
            tok, info = _depart(state, departure.near_tie, pos)
            idx = ranked(state, 1)[0] if departure.rejoin else tok.id - ID_OFFSET
            tokens.append(Token(tok.id, tok.text, tok.logprob, tok.top[:k]))
        elif sampling:
            assert rng is not None
            cands = ranked(state)
            lps = logprobs_profile(state)
            weights = [math.exp((lp - lps[0]) / temperature) for lp in lps]
            rank = rng.choices(range(len(cands)), weights=weights)[0]
            idx = cands[rank]
            top = tuple((PIECES[c], lp) for c, lp in zip(cands[:k], lps, strict=False))
            tokens.append(_token(idx, lps[rank], top))
        elif top_k is not None:
            cands = ranked(state, max(1, k))
            lps = logprobs_profile(state, max(1, k))
            idx = cands[0]
            top = tuple((PIECES[c], lp) for c, lp in zip(cands[:k], lps, strict=False))
            tokens.append(_token(idx, lps[0], top))
        else:
            idx = top_choice(state)
            tokens.append(_token(idx, 0.0, ()))  # logprob not asked for: not computed
        state = next_state(state, idx)
    return tokens, info


def _depart(state: int, near_tie: bool, pos: int) -> tuple[Token, DepartureInfo]:
    """The candidate's token where it departs from the reference, with its own top-k there.

    Near tie: the departing token is the reference's runner-up and the reference's token is
    the candidate's runner-up, with nearly equal logprobs. Otherwise the departing token is
    outside the reference's top-k and the reference's token outside the candidate's.
    """
    cands = ranked(state)
    lps = logprobs_profile(state)
    ref = cands[0]
    if near_tie:
        mid = (lps[0] + lps[1]) / 2.0
        delta = min(0.01, (lps[0] - lps[1]) / 4.0)
        order = [cands[1], cands[0], *cands[2:]]
        new_lps = [mid + delta, mid - delta, *lps[2:]]
    else:
        fresh: list[int] = []
        x = state ^ _DEPART
        while len(fresh) < TOP_K_MAX:
            x = _mix(x)
            idx = x % VOCAB_SIZE
            if idx not in cands and idx not in fresh:
                fresh.append(idx)
        order = fresh
        new_lps = logprobs_profile(state ^ _DEPART)
    top = tuple((PIECES[c], lp) for c, lp in zip(order, new_lps, strict=True))
    tok = _token(order[0], new_lps[0], top)
    info = DepartureInfo(
        position=pos,
        near_tie=near_tie,
        reference_token=PIECES[ref],
        token=PIECES[order[0]],
        reference_top=tuple(PIECES[c] for c in cands),
        top=tuple(PIECES[c] for c in order),
    )
    return tok, info


def apply_stops(
    tokens: list[Token], stops: list[str], include_stop: bool
) -> tuple[list[Token], str | None]:
    """Cut the answer at the first stop string; return the pieces kept and the stop that hit.

    The pieces kept concatenate to the text returned, and the last one may be trimmed, so the
    streamed piece count equals the ``completion_tokens`` reported.
    """
    if not stops:
        return tokens, None
    longest = max(len(s) for s in stops)
    text = ""
    offsets: list[int] = []
    for j, tok in enumerate(tokens):
        offsets.append(len(text))
        begin = max(0, len(text) - longest + 1)
        text += tok.text
        hits = [(i, s) for s in stops if (i := text.find(s, begin)) >= 0]
        if not hits:
            continue
        at, stop = min(hits)
        cut = at + len(stop) if include_stop else at
        kept: list[Token] = []
        for k in range(j + 1):
            lo = offsets[k]
            piece_text = tokens[k].text[: max(0, cut - lo)]
            if not piece_text:
                break
            t = tokens[k]
            kept.append(t if piece_text == t.text else Token(t.id, piece_text, t.logprob, t.top))
        return kept, stop
    return tokens, None


def answer_length(
    natural: int, max_tokens: int | None, min_tokens: int, ignore_eos: bool, max_model_tokens: int
) -> tuple[int, str]:
    """How many tokens an answer has before stop sequences, and why it ends there."""
    limit = max_model_tokens if ignore_eos else max(natural, min_tokens)
    limit = min(limit, max_model_tokens)
    if max_tokens is not None and max_tokens < limit:
        return max_tokens, "length"
    if (limit == max_model_tokens and natural > max_model_tokens) or ignore_eos:
        return limit, "length"
    return limit, "stop"


def complete(
    start: int,
    *,
    natural: int,
    max_tokens: int | None,
    min_tokens: int = 0,
    ignore_eos: bool = False,
    max_model_tokens: int = 4096,
    stops: list[str] | None = None,
    include_stop: bool = False,
    top_k: int | None = None,
    temperature: float = 0.0,
    rng: random.Random | None = None,
    departure: Departure | None = None,
) -> Completion:
    """One choice's full answer, with its finish reason (``stop`` or ``length``)."""
    length, reason = answer_length(natural, max_tokens, min_tokens, ignore_eos, max_model_tokens)
    if departure is not None and departure.position >= length:
        departure = None
    tokens, info = decode(
        start,
        length,
        top_k=top_k,
        temperature=temperature,
        rng=rng,
        departure=departure,
    )
    kept, stop = apply_stops(tokens, stops or [], include_stop)
    if stop is not None:
        reason = "stop"
    # Kept pieces are never empty, so a kept departing token changed the text.
    visible = info is not None and len(kept) > info.position
    return Completion(
        tokens=kept,
        finish_reason=reason,
        stop_reason=stop,
        departure=info,
        visible_departure=visible,
        text="".join(t.text for t in kept),
    )
