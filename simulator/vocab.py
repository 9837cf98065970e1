"""The simulator's small shipped vocabulary of word-pieces.

Pieces look like a BPE tokenizer's output: most words carry their leading space, a few suffix
pieces attach to the previous word, punctuation stands alone. Token ids are the index plus
:data:`ID_OFFSET`, so they look like real ids and never collide with special tokens.
"""

from __future__ import annotations

_WORDS = """
the of and to in is was for that on as with by at from his an be this which or are it had
not but were have one all their has they its been also more other when who first time
new two would into after there can some these may only used most over such many between
than about through where three during under both people city later any then state made well
while world part each before same since being known year work number however system called
water own around several form high because series name found life four day way back those
early still long including game take power main another second home years must often against
large end use area public school group small what different five will same family based left
second point order place music great model data engine request token cache memory batch
latency answer output input server client stream value result test shadow mirror review
question reason simple clear quick light heavy fast slow early late always never every
river mountain forest ocean island valley desert garden bridge tower castle village market
energy signal pattern measure balance change growth limit range field layer graph vector
north south east west summer winter spring autumn morning evening night today tomorrow
red blue green yellow black white silver golden bright dark warm cold quiet loud open close
build write read find keep give tell show move turn run walk speak learn teach begin finish
"""

_CAPITALS = """
The This It In When After However There For Some Many Each Most These Both Our Your We They
"""

_SUFFIXES = ["s", "ed", "ing", "ly", "er", "est", "ness", "ment", "ion", "al", "ive", "able"]
_PUNCT = [",", ".", ";", ":", " (", ")", " -", "!", "?", "\n", "\n\n", ' "', '"']


def _build() -> list[str]:
    seen: set[str] = set()
    pieces: list[str] = []
    for word in _WORDS.split():
        piece = " " + word
        if piece not in seen:
            seen.add(piece)
            pieces.append(piece)
    for word in _CAPITALS.split():
        for piece in (" " + word, word):
            if piece not in seen:
                seen.add(piece)
                pieces.append(piece)
    for piece in _SUFFIXES + _PUNCT:
        if piece not in seen:
            seen.add(piece)
            pieces.append(piece)
    return pieces


PIECES: tuple[str, ...] = tuple(_build())
"""Every piece, each distinct, so a piece's text identifies its token."""

VOCAB_SIZE = len(PIECES)
ID_OFFSET = 1000
"""Token id of ``PIECES[0]``."""


def piece(token_id: int) -> str:
    """The text of one token id."""
    return PIECES[token_id - ID_OFFSET]
