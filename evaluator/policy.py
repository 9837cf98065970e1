"""The verdict policy: criteria with thresholds on measurement keys, read from YAML.

A policy file names the figures that decide a migration and the side of a threshold each must
be on, plus how much data a verdict needs::

    name: default
    min_pairs: 1000          # fewer paired requests in the window -> INCONCLUSIVE
    min_days: 1              # a shorter window -> INCONCLUSIVE (a criterion beyond -> ALERT)
    horizon_days: 30         # the planned review: one look a day for this long
    false_nogo: 0.05         # at most this chance of a NO-GO for identical engines, all looks
    spending: obrien-fleming # how each look's level is set (or pocock; evaluator/sequential.py)
    alert_level: 0.95        # a criterion beyond its threshold at this level -> ALERT (shown)
    false_go: 0.05           # per criterion: at most this chance of a PASS when on the threshold
    near_tie_nats: 0.5       # a divergence is a near tie within this logprob margin (nats)
    criteria:
      - latency.ttft.p95.ratio <= 1.10                     # shorthand: KEY OP THRESHOLD
      - key: incidents.crash.rate_ratio                    # or a mapping, with options
        op: "<="
        threshold: 2
        pass_if_zero: true   # none on the candidate -> PASS, if its rate's exact upper
        zero_budget: 0.25    #   bound is within this budget (events per day; errors: per exchange)
        min_n: 0             # fewer samples behind the measurement -> INCONCLUSIVE
        why: crashes must not double

Keys are those of :mod:`evaluator.results` (``latency.<metric>.<q>.ratio``, ...). ``op`` is
``<=`` (the figure must stay at or below the threshold) or ``>=``. The shipped default policy is
``evaluator/policies/default.yaml`` (:func:`default_policy`). The plan (``horizon_days``,
``false_nogo``, ``spending``) sets the level of every interval at each look
(:meth:`Policy.look`, :mod:`evaluator.sequential`).

Errors: :class:`~evaluator.errors.PolicyError` (an :class:`~evaluator.errors.EvaluatorError`):
the file is missing, not YAML, or a criterion is malformed; the message names the criterion and
says what to fix.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from evaluator.errors import PolicyError
from evaluator.sequential import SPENDINGS, Look, look_at

Op = Literal["<=", ">="]

_METRIC = r"(ttft|tpot|itl|e2e|tokens_per_s)"
_KIND = r"(crash|leak|error_burst|hang|version_change)"
KEY_PATTERNS: tuple[str, ...] = (
    rf"latency\.{_METRIC}\.(p50|p95|p99)\.ratio",
    r"latency\.(ttft|e2e)\.(p50|p95|p99)\.ratio_with_failures",
    rf"latency\.{_METRIC}\.(median_delta|spread_ratio|rank_test_p)",
    r"latency\.goodput\.delta",
    r"errors\.rate_ratio",
    rf"incidents\.{_KIND}\.(rate_ratio|candidate_count)",
    r"incidents\.leak\.candidate_mb_per_hour",
    r"incidents\.leak\.excess_mb_per_hour",
    rf"incidents\.{_KIND}\.candidate_rate",
    r"errors\.candidate_rate",
    r"divergence\.(candidate_rate|noise_rate|excess_rate)",
    r"divergence\.edit_similarity\.mean",
    r"divergence\.(finish_mismatch|json_invalid)\.excess",
    r"divergence\.(hard_excess_rate|near_tie_share|length_shift)",
    r"data\.(pairs|days)",
    r"divergence\.semantic\.(excess|candidate_mean|floor_mean)",
    r"quality\.probe\.(accuracy_delta|candidate_accuracy|incumbent_accuracy)",
    r"quality\.json\.(validity_delta|candidate_validity|incumbent_validity)",
    r"quality\.refusal\.(rate_delta|candidate_rate|incumbent_rate)",
)
"""Every measurement key a criterion may name (see :mod:`evaluator.results`)."""

_KEY_RE = re.compile("|".join(f"(?:{p})" for p in KEY_PATTERNS))
_SHORTHAND_RE = re.compile(r"^\s*(?P<key>[\w.]+)\s*(?P<op><=|>=|<|>|==|=)\s*(?P<thr>\S+)\s*$")

DEFAULT_POLICY = "default"
MAX_NEAR_TIE_NATS = 20.0
"""The largest near-tie margin a policy may set (e^20 to 1 is no tie)."""


def known_key(key: str) -> bool:
    return _KEY_RE.fullmatch(key) is not None


def example_keys() -> list[str]:
    """One concrete key per pattern family (for error messages and docs)."""
    return [
        "latency.ttft.p95.ratio",
        "latency.e2e.spread_ratio",
        "latency.tpot.median_delta",
        "latency.goodput.delta",
        "errors.rate_ratio",
        "incidents.crash.rate_ratio",
        "incidents.leak.candidate_count",
        "incidents.leak.candidate_mb_per_hour",
        "divergence.excess_rate",
        "divergence.edit_similarity.mean",
        "divergence.finish_mismatch.excess",
        "divergence.hard_excess_rate",
        "data.pairs",
        "quality.probe.accuracy_delta",
    ]


@dataclass(frozen=True)
class Criterion:
    """One rule: the measurement under ``key`` must be ``op`` ``threshold``."""

    key: str
    op: Op
    threshold: float
    min_n: int = 0
    """Fewer samples behind the measurement (its ``n``) -> INCONCLUSIVE."""
    pass_if_zero: bool = False
    """For sparse events (errors, incidents): PASS when none were seen on the candidate (the
    value is 0, or no value because neither engine had any event) and ``zero_budget`` holds."""
    why: str = ""
    zero_budget: float | None = None
    """With ``pass_if_zero``: the most candidate events the policy accepts, per day for
    incidents, per exchange sent for errors; zero events pass only when the exact upper bound
    of the candidate's rate (``<...>.candidate_rate``) is within it: zero events in two days
    is not evidence."""

    @property
    def text(self) -> str:
        return f"{self.key} {self.op} {self.threshold:g}"

    def good(self, value: float) -> bool:
        """Whether ``value`` is on the good side of the threshold (the threshold is good)."""
        return value <= self.threshold if self.op == "<=" else value >= self.threshold

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "op": self.op,
            "threshold": self.threshold,
            "min_n": self.min_n,
            "pass_if_zero": self.pass_if_zero,
            "why": self.why,
            "text": self.text,
            "zero_budget": self.zero_budget,
        }

    @property
    def rate_key(self) -> str | None:
        """The candidate's own rate behind a rate ratio (``zero_budget`` is judged on it)."""
        if self.key == "errors.rate_ratio":
            return "errors.candidate_rate"
        if self.key.startswith("incidents.") and self.key.endswith(".rate_ratio"):
            return self.key.removesuffix("rate_ratio") + "candidate_rate"
        return None


@dataclass(frozen=True)
class Policy:
    """A named list of criteria and the minimum data a verdict needs."""

    name: str
    criteria: tuple[Criterion, ...]
    min_pairs: int = 1000
    min_days: float = 1.0
    description: str = ""
    source: str = ""
    """Where the policy came from (a path, ``<default>`` or ``<dict>``)."""
    notes: tuple[str, ...] = field(default=())
    """Changes made after loading (e.g. the demo waiving ``min_days``), shown in the report."""
    horizon_days: float = 30.0
    """The planned review: one look a day for this many days (:mod:`evaluator.sequential`)."""
    false_nogo: float = 0.05
    """The family-wise chance of a NO-GO for identical engines at some look of the plan."""
    spending: str = "obrien-fleming"
    """How each look's share of ``false_nogo`` is set: ``obrien-fleming`` or ``pocock``."""
    alert_level: float = 0.95
    """A criterion whose interval at this level is beyond its threshold, without the plan's
    boundary crossed (or before ``min_days``), is an ALERT: shown, not a NO-GO."""
    false_go: float | None = None
    """Each criterion's chance of a PASS at some look when the truth sits on its threshold (the
    PASS side's own boundaries, not split over criteria: :func:`evaluator.sequential.look_at`);
    None: PASS at the FAIL side's level."""
    near_tie_nats: float | None = None
    """A divergence is a near tie when the logprob margin at its first token is within this many
    nats (:mod:`evaluator.divergence`; judged by ``divergence.hard_excess_rate``); None: the
    analysis' default (0.5)."""

    def with_minimums(
        self,
        *,
        min_pairs: int | None = None,
        min_days: float | None = None,
        note: str = "",
        horizon_days: float | None = None,
    ) -> Policy:
        """A copy with other data minimums (and horizon); ``note`` says why (the report shows
        it)."""
        return replace(
            self,
            min_pairs=self.min_pairs if min_pairs is None else min_pairs,
            min_days=self.min_days if min_days is None else min_days,
            horizon_days=self.horizon_days if horizon_days is None else horizon_days,
            notes=(*self.notes, note) if note else self.notes,
        )

    def look(self, days: float) -> Look:
        """The look a window of ``days`` is within the plan, with its intervals' level."""
        return look_at(
            days,
            horizon_days=self.horizon_days,
            false_nogo=self.false_nogo,
            criteria=len(self.criteria),
            spending=self.spending,
            false_go=self.false_go,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "min_pairs": self.min_pairs,
            "min_days": self.min_days,
            "criteria": [c.to_dict() for c in self.criteria],
            "notes": list(self.notes),
            "horizon_days": self.horizon_days,
            "false_nogo": self.false_nogo,
            "spending": self.spending,
            "alert_level": self.alert_level,
            "false_go": self.false_go,
            "near_tie_nats": self.near_tie_nats,
        }


def _where(source: str, index: int | None) -> str:
    return f"{source}: criterion {index + 1}" if index is not None else source


def _unknown_key_message(key: str, where: str) -> str:
    close = difflib.get_close_matches(key, example_keys(), n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return (
        f"{where}: unknown measurement key {key!r}.{hint} Keys look like "
        f"{', '.join(example_keys()[:6])}, ... (the full list is in evaluator/results.py)"
    )


def _number(value: Any, what: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise PolicyError(f"{where}: {what} must be a number, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise PolicyError(f"{where}: {what} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise PolicyError(f"{where}: {what} must be a finite number, got {value!r}")
    return number


def _op(op: Any, where: str) -> Op:
    if op in ("<", ">", "=", "=="):
        raise PolicyError(
            f"{where}: operator {op!r} is not supported: use '<=' (must stay at or below the"
            " threshold) or '>=' (must stay at or above it)"
        )
    if op == "<=":
        return "<="
    if op == ">=":
        return ">="
    raise PolicyError(f"{where}: op must be '<=' or '>=', got {op!r}")


def parse_criterion(raw: Any, where: str) -> Criterion:
    """A criterion from its shorthand string (``"KEY <= 1.1"``) or its mapping form."""
    if isinstance(raw, str):
        m = _SHORTHAND_RE.match(raw)
        if not m:
            raise PolicyError(
                f"{where}: {raw!r} is not 'KEY OP THRESHOLD'"
                " (e.g. 'latency.ttft.p95.ratio <= 1.10')"
            )
        key, op, threshold = m["key"], _op(m["op"], where), _number(m["thr"], "threshold", where)
        if not known_key(key):
            raise PolicyError(_unknown_key_message(key, where))
        return Criterion(key=key, op=op, threshold=threshold)
    if not isinstance(raw, dict):
        raise PolicyError(
            f"{where}: a criterion is a string 'KEY OP THRESHOLD' or a mapping with key, op and"
            f" threshold, got {type(raw).__name__}"
        )
    allowed = {"key", "op", "threshold", "min_n", "pass_if_zero", "why", "text", "zero_budget"}
    extra = sorted(set(raw) - allowed)
    if extra:
        raise PolicyError(
            f"{where}: unknown field(s) {', '.join(extra)}; allowed: {', '.join(sorted(allowed))}"
        )
    missing = [f for f in ("key", "op", "threshold") if f not in raw]
    if missing:
        raise PolicyError(
            f"{where}: missing {', '.join(missing)} (a criterion needs key, op and threshold)"
        )
    key = raw["key"]
    if not isinstance(key, str) or not known_key(key):
        raise PolicyError(_unknown_key_message(str(key), where))
    min_n = raw.get("min_n", 0)
    if isinstance(min_n, bool) or not isinstance(min_n, int) or min_n < 0:
        raise PolicyError(f"{where}: min_n must be a whole number >= 0, got {min_n!r}")
    pass_if_zero = raw.get("pass_if_zero", False)
    if not isinstance(pass_if_zero, bool):
        raise PolicyError(f"{where}: pass_if_zero must be true or false, got {pass_if_zero!r}")
    why = raw.get("why", "")
    if not isinstance(why, str):
        raise PolicyError(f"{where}: why must be text, got {why!r}")
    budget = raw.get("zero_budget")
    if budget is not None:
        budget = _number(budget, "zero_budget", where)
        if budget <= 0:
            raise PolicyError(f"{where}: zero_budget must be > 0, got {raw['zero_budget']!r}")
    key_ = str(key)
    rated = key_ == "errors.rate_ratio" or (
        key_.startswith("incidents.") and key_.endswith(".rate_ratio")
    )
    if budget is not None and not rated:
        raise PolicyError(
            f"{where}: zero_budget applies to errors.rate_ratio and incidents.<kind>.rate_ratio"
            f" with pass_if_zero, not to {key_}"
        )
    return Criterion(
        key=key,
        op=_op(raw["op"], where),
        threshold=_number(raw["threshold"], "threshold", where),
        min_n=min_n,
        pass_if_zero=pass_if_zero,
        why=why,
        zero_budget=budget,
    )


def _plan(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """The plan's fields (horizon, family-wise false NO-GO, spending, alert level), checked."""
    horizon = _number(raw.get("horizon_days", 30.0), "horizon_days", source)
    if horizon <= 0:
        raise PolicyError(f"{source}: horizon_days must be > 0 (the planned days of looks)")
    false_nogo = _number(raw.get("false_nogo", 0.05), "false_nogo", source)
    if not 0 < false_nogo < 0.5:
        raise PolicyError(f"{source}: false_nogo must be between 0 and 0.5, e.g. 0.05")
    spending = raw.get("spending", "obrien-fleming")
    if spending not in SPENDINGS:
        raise PolicyError(
            f"{source}: spending must be one of {', '.join(SPENDINGS)}, got {spending!r}"
        )
    alert = _number(raw.get("alert_level", 0.95), "alert_level", source)
    if not 0.5 <= alert < 1:
        raise PolicyError(f"{source}: alert_level must be in [0.5, 1), e.g. 0.95")
    false_go = raw.get("false_go")
    if false_go is not None:
        false_go = _number(false_go, "false_go", source)
        if not 0 < false_go < 0.5:
            raise PolicyError(
                f"{source}: false_go must be between 0 and 0.5, e.g. 0.05 (or left out: PASS"
                " at the FAIL side's level)"
            )
    near_tie = raw.get("near_tie_nats")
    if near_tie is not None:
        near_tie = _number(near_tie, "near_tie_nats", source)
        if not 0 <= near_tie <= MAX_NEAR_TIE_NATS:
            raise PolicyError(
                f"{source}: near_tie_nats must be a logprob margin in nats between 0 and"
                f" {MAX_NEAR_TIE_NATS:g}, e.g. 0.5 (two tokens about 1.65 to 1), got {near_tie!r}"
                " (or left out: the analysis' default, 0.5)"
            )
    return {
        "horizon_days": horizon,
        "false_nogo": false_nogo,
        "spending": str(spending),
        "alert_level": alert,
        "false_go": false_go,
        "near_tie_nats": near_tie,
    }


def parse_policy(raw: Any, source: str = "<dict>") -> Policy:
    """Validate a policy mapping (as read from YAML); :class:`PolicyError` says what to fix."""
    if not isinstance(raw, dict):
        raise PolicyError(
            f"{source}: a policy is a mapping with name, min_pairs, min_days and criteria,"
            f" got {type(raw).__name__}"
        )
    # source and notes: what Policy.to_dict() adds (a policy stored with a deployment).
    allowed = {"name", "description", "min_pairs", "min_days", "criteria", "source", "notes"}
    allowed |= {"horizon_days", "false_nogo", "spending", "alert_level", "false_go"}
    allowed |= {"near_tie_nats"}
    extra = sorted(set(raw) - allowed)
    if extra:
        raise PolicyError(
            f"{source}: unknown field(s) {', '.join(extra)}; allowed: {', '.join(sorted(allowed))}"
        )
    criteria_raw = raw.get("criteria")
    if not isinstance(criteria_raw, list) or not criteria_raw:
        raise PolicyError(
            f"{source}: 'criteria' must be a non-empty list, e.g. "
            "['latency.ttft.p95.ratio <= 1.10', 'divergence.excess_rate <= 0.02']"
        )
    criteria = tuple(parse_criterion(c, _where(source, i)) for i, c in enumerate(criteria_raw))
    seen: set[tuple[str, str]] = set()
    for c in criteria:
        if (c.key, c.op) in seen:
            raise PolicyError(f"{source}: {c.key} {c.op} appears twice; keep one threshold")
        seen.add((c.key, c.op))
    min_pairs = raw.get("min_pairs", 1000)
    if isinstance(min_pairs, bool) or not isinstance(min_pairs, int) or min_pairs < 0:
        raise PolicyError(f"{source}: min_pairs must be a whole number >= 0, got {min_pairs!r}")
    min_days = _number(raw.get("min_days", 1.0), "min_days", source)
    if min_days < 0:
        raise PolicyError(f"{source}: min_days must be >= 0, got {min_days!r}")
    name = raw.get("name", Path(source).stem if source.endswith((".yaml", ".yml")) else "policy")
    description = raw.get("description", "")
    if not isinstance(name, str) or not isinstance(description, str):
        raise PolicyError(f"{source}: name and description must be text")
    notes = raw.get("notes") or []
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise PolicyError(f"{source}: notes must be a list of sentences")
    return Policy(
        name=name,
        criteria=criteria,
        min_pairs=min_pairs,
        min_days=min_days,
        description=description,
        source=source,
        notes=tuple(notes),
        **_plan(raw, source),
    )


def _parse_yaml(text: str, source: str) -> Policy:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(f"{source}: not valid YAML ({exc})") from None
    return parse_policy(raw, source)


def default_policy() -> Policy:
    """The shipped policy, ``evaluator/policies/default.yaml``."""
    text = resources.files("evaluator").joinpath("policies/default.yaml").read_text()
    return _parse_yaml(text, "<default>")


def load_policy(path: str | Path | None = None) -> Policy:
    """The policy at ``path`` (a YAML file), or the shipped default when ``path`` is None or
    ``"default"``."""
    if path is None or str(path) == DEFAULT_POLICY:
        return default_policy()
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise PolicyError(
            f"policy file {p} not found: give a YAML file or 'default' for the shipped policy"
        ) from None
    except OSError as exc:
        raise PolicyError(f"policy file {p} cannot be read: {exc.strerror}") from None
    return _parse_yaml(text, str(p))
