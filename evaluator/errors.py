"""The evaluator's errors: one tree, so a command or the API catches the base, or the one error
it answers differently (the API: an unknown deployment is a 404, a bad query a 422).

::

    EvaluatorError (ValueError)     base: the evaluator was asked something it cannot do;
    │                               the message says what to do instead
    ├── UnknownDeployment           no such deployment; ``known`` lists the ones that exist
    ├── EmptyWindow                 the window is empty, or holds no mirrored pairs to review
    ├── BadQuery                    an incident query's argument that cannot work (kind, by, ...)
    ├── LatencyError                a latency analysis argument that cannot work (naive window)
    ├── PolicyError                 a policy that cannot be used (missing, not YAML, malformed)
    └── RenderError                 a review that cannot be rendered as asked (unknown format)

Each is importable from the module that raises it, too. Store failures are not evaluator
errors: they surface as :class:`storage.errors.StorageError`.
"""

from __future__ import annotations


class EvaluatorError(ValueError):
    """The evaluator was asked something it cannot do; the message says what to do instead."""


class UnknownDeployment(EvaluatorError):
    """No deployment of that name in the store; ``known`` lists the ones that exist."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        listed = ", ".join(known) if known else "none (no records have been stored yet)"
        super().__init__(f"no deployment named {name!r}; known deployments: {listed}")


class EmptyWindow(EvaluatorError):
    """The window is empty, or holds no mirrored pairs of the deployment."""


class BadQuery(EvaluatorError):
    """An argument of an incident query that cannot work, with what to pass instead."""


class LatencyError(EvaluatorError):
    """The latency analysis was asked something it cannot answer (bad window, unknown role)."""


class PolicyError(EvaluatorError):
    """A policy that cannot be used; the message says what to fix."""


class RenderError(EvaluatorError):
    """The review cannot be rendered as asked (unknown format)."""
