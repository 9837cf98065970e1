"""What the mirror asks of the candidate beyond the client's request, engine by engine.

The mirror adds one ask to the candidate's copy: top logprobs
(:func:`mirror.rewrite.ask_top_logprobs`, ``shadow.top_logprobs``), for the evaluator's near-tie
margin. An engine that refuses it answers 400, and a request the client never made fails on the
candidate alone. So :class:`Asks`:

- knows the refusals recorded from the engines' own serving code: TensorRT-LLM 1.2.0rc2's
  ``/v1/completions`` answers 400 "logprobs is not supported" (tests/fixtures/trtllm-1.2.0rc2),
  so with ``candidate.flavor: trtllm`` completions never get the ask (with ``auto`` the mirror
  cannot know up front); its 400 "Multiple response is not supported in PyTorch workflow" to
  ``n > 1`` is the client's own ask: the request goes unchanged and its record notes
  ``unsupported:n`` (the candidate's 400 there is a failure like any other);
- learns the rest (:meth:`Asks.refused`): a 400 whose message names logprobs, to a request whose
  only logprobs ask is the mirror's, stops the ask on that route for the life of the process
  (logged once at WARNING, counted in ``shadow_ab_mirror_asks_dropped_total{route,ask}``). That
  exchange was the mirror's doing, not the candidate's failure: :mod:`mirror.shadow` records it
  ``cancelled`` (the status the evaluator never counts as a failure) with the engine's 400 and
  message kept and the rewrite ``refused:logprobs``.

Errors: none.
"""

from __future__ import annotations

import logging
from typing import Any

from mirror.metrics import ASKS_DROPPED
from mirror.rewrite import LOGPROBS

log = logging.getLogger(__name__)

REFUSED = "refused"
"""Rewrite prefix of a candidate exchange that failed on an ask the mirror added
(``refused:logprobs``): recorded ``cancelled``, not the candidate's failure."""
UNSUPPORTED_N = "unsupported:n"
"""Rewrite note: the client asked ``n > 1`` of a TensorRT-LLM candidate, which refuses it."""


def client_asks_logprobs(body: dict[str, Any]) -> bool:
    """Whether the client's own request asks for logprobs of any kind (then a refusal names
    its ask too, not only the mirror's)."""
    return body.get("logprobs") not in (None, False, 0) or body.get("top_logprobs") not in (
        None,
        0,
    )


class Asks:
    """The asks added to one mirror process's candidate requests (see the module docstring)."""

    def __init__(self, flavor: str) -> None:
        self.trtllm = flavor == "trtllm"
        self.dropped: set[tuple[str, str]] = set()
        """(route, ask) the candidate refused: not added again in this process."""

    def top_logprobs(self, route: str, *, chat: bool, k: int | None) -> int | None:
        """How many top logprobs to ask of the candidate on ``route`` (None: no ask)."""
        if not k or (self.trtllm and not chat) or (route, LOGPROBS) in self.dropped:
            return None
        return k

    def notes(self, body: dict[str, Any]) -> list[str]:
        """Rewrite notes on the client's own asks the candidate cannot answer."""
        n = body.get("n")
        if self.trtllm and isinstance(n, int) and not isinstance(n, bool) and n > 1:
            return [UNSUPPORTED_N]
        return []

    def refused(self, route: str, ask: str, http_status: int | None, error: str | None) -> bool:
        """Whether a candidate answer (``http_status``, its ``error`` text) to a request whose
        only ``ask`` was the mirror's is a refusal of that ask; if so the ask stops on
        ``route`` (logged and counted the first time)."""
        if http_status != 400 or ask not in (error or "").lower():
            return False
        if (route, ask) not in self.dropped:
            self.dropped.add((route, ask))
            ASKS_DROPPED.labels(route=route, ask=ask).inc()
            log.warning(
                "the candidate refused the %s the mirror adds on %s (%s): no longer asked"
                " on that route by this process",
                ask,
                route,
                (error or "")[:200],
            )
        return True
