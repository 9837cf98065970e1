"""Proof that the verdict is right: simulator scenarios driven through the real mirror (a
``shadow-ab mirror`` subprocess, direct sink into SQLite, health sampler inside) and judged by
the real analyses, checked against what the simulators' ledgers say was injected.

- A/A (both engines clean): never NO-GO, no criterion FAILs, no incidents, no divergence;
- candidate 20 % faster decode: TPOT ratio below 1, the true per-token saving inside the paired
  median delta's interval;
- candidate crashing: exactly the ledger's number of (observable) crashes found on the
  candidate, none on the incumbent;
- candidate leaking: one leak, its slope within 20 % of the injected rate (in wall-clock MB/h:
  the simulator's MB per simulated hour times its time scale);
- candidate diverging with a known share of near ties: the ledger's divergence rate inside the
  evaluator's interval, and the diverged pairs counted (almost) exactly;
- candidate on other kernels (near-tie flips): not NO-GO on quality; a worse candidate (wrong
  probe answers, broken JSON, truncated answers), with the mirror's probes on: NO-GO on exactly
  the criteria that damage touches, the probe accuracy's interval holding the injected one.

Each run is short (seconds of traffic; small answers; time-compressed fault schedules).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import Engine, func, select

from evaluator.divergence import DivergenceConfig
from evaluator.incidents.model import IncidentConfig
from evaluator.policy import default_policy
from evaluator.quality import QualityConfig
from evaluator.results import Measurement
from evaluator.review import Review, build_review, default_analyses, resolve_window
from evaluator.verdict import Decision, Outcome
from shadow_ab.dev.probeset import SHIPPED
from shadow_ab.dev.processes import running_mirror, running_sim
from shadow_ab.dev.traffic import TrafficMix, TrafficResult, run_traffic_sync
from simulator.ledger import Injected, summarize
from simulator.scenario import read_raw
from storage.db import make_engine
from storage.migrate import upgrade
from storage.models import Exchange, HealthSampleRow

pytestmark = [
    pytest.mark.slow,
    # scipy warns when a bootstrap interval comes out NaN on few pairs (evaluator/stats.py);
    # the verdict treats such a criterion as INCONCLUSIVE, which these tests tolerate.
    pytest.mark.filterwarnings("ignore::scipy.stats.DegenerateDataWarning"),
]

DEP = "proof"
SMALL_ANSWERS = {"answers": {"min_tokens": 8, "max_tokens": 24}}
# Greedy, streamed, short prompts: every pair comparable.
GREEDY_MIX = TrafficMix(
    greedy_share=1.0,
    stream_share=1.0,
    json_share=0.0,
    long_prompt_share=0.0,
    max_tokens=(24,),
    sessions=16,
)


PROBES_AFTER_TRAFFIC_S = 3.0


def _unix(ts: datetime) -> float:
    return (ts if ts.tzinfo else ts.replace(tzinfo=UTC)).timestamp()


@dataclass
class Run:
    engine: Engine
    incumbent: Injected
    candidate: Injected
    traffic: TrafficResult
    candidate_ledger: list[dict[str, Any]] = field(default_factory=list)

    def review(self, *, min_n: int | None = None, **analyses: Any) -> Review:
        window = resolve_window(self.engine, DEP)
        # A run of minutes is one look: the whole plan (horizon) is the run.
        policy = default_policy().with_minimums(min_pairs=50, min_days=0.0, horizon_days=1.0)
        if min_n is not None:  # seconds of probes: fewer than a day's
            criteria = tuple(replace(c, min_n=min(c.min_n, min_n)) for c in policy.criteria)
            policy = replace(policy, criteria=criteria)
        return build_review(
            self.engine,
            DEP,
            window,
            policy,
            analyses=default_analyses(
                divergence_config=DivergenceConfig(max_pairs_per_day=50_000, max_pairs=50_000),
                **analyses,
            ),
            store=False,
            with_html=False,
        )

    def pairs(self) -> int:
        """Mirrored pairs whose candidate answered."""
        with self.engine.connect() as conn:
            stmt = select(func.count()).where(
                Exchange.deployment == DEP, Exchange.role == "candidate", Exchange.status == "ok"
            )
            return int(conn.execute(stmt).scalar_one())

    def health_span(self, role: str) -> tuple[float, float]:
        """Unix seconds of the first and last health sample of ``role``'s engine."""
        with self.engine.connect() as conn:
            first, last = conn.execute(
                select(func.min(HealthSampleRow.ts), func.max(HealthSampleRow.ts)).where(
                    HealthSampleRow.deployment == DEP, HealthSampleRow.role == role
                )
            ).one()
        return _unix(first), _unix(last)


def _scenario(name: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    raw, _ = read_raw(name)
    raw = {**raw, **SMALL_ANSWERS}
    for key, value in (extra or {}).items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return raw


@contextlib.contextmanager
def shadow_run(
    tmp_path: Path,
    incumbent: dict[str, Any],
    candidate: dict[str, Any],
    *,
    requests: int | None = None,
    duration_s: float | None = None,
    concurrency: int = 8,
    time_scale: float = 1.0,
    replay_rate: float = 0.3,
    health_interval_s: float = 0.5,
    mix: TrafficMix = GREEDY_MIX,
    probes: dict[str, Any] | None = None,
) -> Iterator[Run]:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    engine = make_engine(url)
    with (
        running_sim("vllm", incumbent, time_scale=time_scale) as inc,
        running_sim("trtllm", candidate, time_scale=time_scale) as cand,
    ):
        with running_mirror(
            inc.base_url,
            cand.base_url,
            database_url=url,
            deployment=DEP,
            shadow={"rate": 1.0, "replay_rate": replay_rate},
            # The harness stores every answered request as a pair; the interference guard would
            # shed shadows when a loaded machine slows the incumbent (tests/mirror covers it).
            guard={"enabled": False},
            health={"interval_s": health_interval_s},
            probes={"per_minute": 0, **(probes or {})},
        ) as mirror:
            traffic = run_traffic_sync(
                mirror.v1,
                mix,
                concurrency=concurrency,
                requests=requests,
                duration_s=duration_s,
                timeout_s=30.0,
            )
            if probes:
                time.sleep(PROBES_AFTER_TRAFFIC_S)  # probes go on: a few seconds more of them
            mirror.stop()
        lines = cand.ledger()
        run = Run(engine, summarize(inc.ledger()), summarize(lines), traffic, lines)
    try:
        yield run
    finally:
        engine.dispose()


def by_key(review: Review) -> dict[str, Measurement]:
    return {m.key: m for m in review.measurements}


def test_aa_is_never_no_go(tmp_path: Path) -> None:
    with shadow_run(tmp_path, _scenario("clean"), _scenario("clean"), requests=160) as run:
        review = run.review()
        pairs = run.pairs()
    # The harness: the window is the run, every answered request is a stored pair.
    assert pairs == sum(1 for r in run.traffic.rows if r.ok) and pairs >= 150
    assert timedelta(0) < review.window[1] - review.window[0] < timedelta(minutes=5)
    assert run.incumbent.incidents == [] and run.candidate.incidents == []
    assert review.verdict.decision is not Decision.NO_GO, review.verdict.reason
    failed = [r.criterion.text for r in review.verdict.results if r.outcome is Outcome.FAIL]
    assert failed == []
    m = by_key(review)
    assert m["incidents.crash.candidate_count"].value == 0
    assert m["divergence.candidate_rate"].value == 0  # greedy A/A answers match exactly


def test_faster_decode_is_seen_with_its_size(tmp_path: Path) -> None:
    decode_s = 0.040
    slow = {"latency": {"decode_ms": decode_s * 1000, "noise": 0.03, "batch_slowdown": 0.0}}
    fast = {"latency": {"decode_ms": decode_s * 800, "noise": 0.03, "batch_slowdown": 0.0}}
    with shadow_run(
        tmp_path,
        _scenario("clean", slow),
        _scenario("clean", fast),
        requests=120,
        replay_rate=0.0,
    ) as run:
        review = run.review()
    m = by_key(review)
    tpot = m["latency.tpot.p50.ratio"]
    assert tpot.value is not None and tpot.interval is not None
    assert tpot.interval.high < 1.0, tpot  # the sign: the candidate is faster
    # The size: the injected -20 % of decode time per token inside the paired median delta's
    # interval. (The ratio also carries the loop and network overhead that both engines add
    # to every token gap, which pulls it towards 1 on a loaded machine; the paired difference
    # cancels it. 1 ms of slack for the event loop's timer jitter.)
    delta = m["latency.tpot.median_delta"]
    assert delta.value is not None and delta.interval is not None
    truth = -0.2 * decode_s
    assert delta.interval.low - 0.001 <= truth <= delta.interval.high + 0.001, delta
    assert 0.75 <= tpot.value <= 0.95, tpot


def test_crash_count_matches_the_ledger(tmp_path: Path) -> None:
    # Two crashes at fixed simulated (= real, time scale 1) seconds after the simulator's start;
    # the traffic outlasts both restarts.
    crashy = {"faults": [{"kind": "crash", "at_s": [12.0, 26.0], "restart_delay_s": 0.5}]}
    with shadow_run(
        tmp_path,
        _scenario("clean"),
        _scenario("clean", crashy),
        duration_s=36.0,
        replay_rate=0.0,
    ) as run:
        # Crashes here come seconds apart (a deployment's come hours apart): cluster the
        # failures around each one over seconds, not the default minute.
        config = replace(IncidentConfig(), cluster_gap_s=4.0, crash_margin_s=4.0)
        review = run.review(incident_config=config)
        first, last = run.health_span("candidate")
    # What the evaluator could see: crashes whose down time and restart both fell between the
    # health sampler's first and last look at the candidate (on a loaded machine the mirror may
    # come up after the first crash); a crash that fell while the engine was still down is not
    # effective in the ledger.
    injected = sorted(
        (
            i
            for i in run.candidate.of_kind("crash")
            if i.effective and i.recovered_at and first < i.start and i.recovered_at < last - 1
        ),
        key=lambda i: i.start,
    )
    assert len(injected) >= 1 and all(i.recovered_at for i in injected)
    m = by_key(review)
    assert m["incidents.crash.candidate_count"].value == len(injected)
    found = review.sections["incidents"]["timeline"]
    crashes = [f for f in found if f["kind"] == "crash"]
    assert [f["role"] for f in crashes] == ["candidate"] * len(injected)
    # Each found crash starts within seconds of an injected one.
    starts = sorted(_unix(datetime.fromisoformat(f["started_at"])) for f in crashes)
    for found_at, inj in zip(starts, injected, strict=True):
        assert abs(found_at - inj.start) < 5.0, (found_at, inj)


def test_leak_rate_within_20_percent(tmp_path: Path) -> None:
    time_scale = 360.0  # 1 real second = 6 simulated minutes
    leak = {"faults": [{"kind": "leak", "start_s": 0, "mb_per_hour": 150}]}
    with shadow_run(
        tmp_path,
        _scenario("clean"),
        _scenario("clean", leak),
        duration_s=30.0,
        time_scale=time_scale,
        replay_rate=0.0,
        health_interval_s=0.5,
    ) as run:
        expected = 150 * time_scale  # MB per wall-clock hour
        config = replace(
            IncidentConfig(),
            leak_sustain_h=12 / 3600,
            leak_max_span_h=30 / 3600,
            leak_step_min=2 / 60,
            leak_warmup_min=0.0,  # the simulator's memory does not refill after a start
            leak_bin_s=1.0,
            leak_min_points=8,
            leak_threshold_mb_h=expected * 0.3,
        )
        review = run.review(incident_config=config)
    assert [i.kind for i in run.candidate.incidents] == ["leak"]
    m = by_key(review)
    assert m["incidents.leak.candidate_count"].value == 1
    slope = m["incidents.leak.candidate_mb_per_hour"].value
    assert slope is not None and abs(slope - expected) <= 0.2 * expected, (slope, expected)
    # Compared with the incumbent (flat memory): the candidate grows the injected rate faster.
    excess = m["incidents.leak.excess_mb_per_hour"]
    assert excess.value is not None and abs(excess.value - expected) <= 0.2 * expected, (
        review.sections["incidents"]["memory_comparison"]
    )
    assert excess.interval is not None and excess.interval.contains(excess.value)
    leak_rule = next(
        r for r in review.verdict.results if r.criterion.key == "incidents.leak.excess_mb_per_hour"
    )
    assert leak_rule.outcome is Outcome.FAIL


def test_divergence_rate_inside_its_interval(tmp_path: Path) -> None:
    # p 0.4, half of them hard: ~40 hard departures in ~200 pairs. At p 0.25 (~25 expected) a
    # run with 14 or fewer (about 1 run in 70) put the hard excess's lower bound under the
    # threshold at the sequential boundary: an ALERT, where the test wants the FAIL.
    drift = {"divergence": {"p": 0.4, "near_tie_share": 0.5, "position_min": 0}}
    with shadow_run(
        tmp_path,
        _scenario("clean"),
        _scenario("clean", drift),
        requests=200,
        replay_rate=1.0,  # the excess is judged on triads (requests with a replay too)
    ) as run:
        review = run.review()
        pairs = run.pairs()
    diverged = run.candidate.diverged_pairs(visible_only=True)
    assert pairs >= 150 and len(diverged) > 10
    truth = len(diverged) / pairs
    m = by_key(review)
    rate = m["divergence.candidate_rate"]
    assert rate.interval is not None and rate.interval.contains(truth), (rate, truth)
    counted = review.sections["divergence"]["candidate"]["diverged"]
    assert abs(counted - len(diverged)) <= 2, (counted, len(diverged))
    assert m["divergence.noise_rate"].value == 0  # clean incumbent: replays match exactly
    excess = m["divergence.excess_rate"]
    assert excess.interval is not None and excess.interval.low > 0.02
    # Half the departures are hard (a token outside the reference's top-k): the default
    # policy's hard excess fails.
    rule = next(
        r for r in review.verdict.results if r.criterion.key == "divergence.hard_excess_rate"
    )
    assert rule.outcome is Outcome.FAIL
    assert review.verdict.decision is Decision.NO_GO


QUALITY_KEYS = (
    "divergence.hard_excess_rate",
    "divergence.finish_mismatch.excess",
    "divergence.length_shift",
)


def test_different_kernels_are_not_no_go_on_quality(tmp_path: Path) -> None:
    """A candidate on other kernels: many greedy answers differ, each at a near tie, and go on
    as the incumbent's do. The exact-match excess is large (information), the quality criteria
    do not fail."""
    kernels = {"quality": {"kernels": {"p": 0.5}, "probe_accuracy": 1.0}}
    with shadow_run(
        tmp_path,
        _scenario("clean", {"quality": {"probe_accuracy": 1.0}}),
        _scenario("clean", kernels),
        requests=140,
        replay_rate=1.0,
        probes={"per_minute": 600},  # the mirror's probes on: answered alike by both
    ) as run:
        review = run.review(min_n=10)
    flips = run.candidate.diverged_pairs(visible_only=True)
    assert len(flips) > 30 and {d["knob"] for d in flips.values()} == {"kernels"}
    m = by_key(review)
    assert m["divergence.excess_rate"].interval is not None
    assert m["divergence.excess_rate"].interval.low > 0.2  # many divergences...
    assert m["divergence.near_tie_share"].value == 1.0  # ...every one a near tie by margin
    assert m["divergence.hard_excess_rate"].value == 0.0
    assert m["divergence.length_shift"].value == 0.0
    assert m["divergence.finish_mismatch.excess"].value == 0.0
    assert m["quality.probe.accuracy_delta"].value == 0.0  # probes: not worse either
    judged = {r.criterion.key: r.outcome for r in review.verdict.results}
    quality = (*QUALITY_KEYS, "quality.probe.accuracy_delta", "quality.refusal.rate_delta")
    assert {judged[k] for k in quality} <= {Outcome.PASS, Outcome.INCONCLUSIVE}, judged
    assert review.verdict.decision is not Decision.NO_GO, review.verdict.reason


def test_a_worse_candidate_is_no_go_on_what_the_damage_touches(tmp_path: Path) -> None:
    """Through the mirror with its probes on (10 pairs a second to both engines): a candidate
    that cuts 40 % of its answers short (finish "length"), answers probes wrongly half the time
    and breaks 90 % of its JSON (the JSON probes) is NO-GO on the hard excess, the finish-reason
    mismatch, the length shift (whose interval holds the ledger's own shift), probe accuracy and
    JSON validity, and on nothing it did not damage (refusals, errors). Each engine's probe
    accuracy interval holds the accuracy its simulator injected."""
    # A probe set of the shipped probes, JSON ones first: seconds of probes hold enough JSON.
    shipped = SHIPPED.read_text().splitlines()
    kinds = [(line, orjson.loads(line)["kind"]) for line in shipped if line.startswith("{")]
    probe_set = tmp_path / "probes.jsonl"
    chosen = [x for x, k in kinds if k == "json"] + [x for x, k in kinds if k == "arithmetic"][:40]
    probe_set.write_text("\n".join(chosen) + "\n")
    told = {"incumbent": 0.95, "candidate": 0.5}
    sets = {"probe_set": str(probe_set)}
    healthy = {"quality": {"probe_accuracy": told["incumbent"], **sets}}
    worse = {
        "quality": {
            "truncate": {"p": 0.4, "finish": "length"},
            "probe_accuracy": told["candidate"],
            "broken_json": 0.9,
            **sets,
        }
    }
    with shadow_run(
        tmp_path,
        _scenario("clean", healthy),
        _scenario("clean", worse),
        requests=140,
        replay_rate=1.0,
        probes={"per_minute": 600, "set": str(probe_set)},
    ) as run:
        # seconds of probes, not a day's: the quality criteria's min_n lowered to 10
        review = run.review(min_n=10, quality_config=QualityConfig(probe_set=str(probe_set)))
    cuts = run.candidate.truncations
    assert len(cuts) > 20
    m = by_key(review)
    shift = m["divergence.length_shift"]
    truth = sum(math.log(c["kept"] / c["of"]) for c in cuts) / shift.n
    assert shift.interval is not None and shift.interval.contains(truth), (shift, truth)
    probes = [x for x in run.candidate_ledger if x["event"] == "probe"]
    assert len(probes) >= 20, len(probes)
    judged = {r.criterion.key: r.outcome for r in review.verdict.results}
    damaged = (*QUALITY_KEYS, "quality.probe.accuracy_delta", "quality.json.validity_delta")
    seen = {k: (judged[k], m[k].value, m[k].interval, m[k].n) for k in damaged}
    assert {k: judged[k] for k in damaged} == dict.fromkeys(damaged, Outcome.FAIL), seen
    assert judged["quality.refusal.rate_delta"] is not Outcome.FAIL
    assert judged["errors.rate_ratio"] is not Outcome.FAIL
    assert review.verdict.decision is Decision.NO_GO
    # The injected accuracy: the knob's, and a broken JSON answer is wrong too (the ledger's
    # probe lines say which probes each engine was asked).
    injected = {
        "incumbent": told["incumbent"],
        "candidate": sum(told["candidate"] * (0.1 if x["kind"] == "json" else 1) for x in probes)
        / len(probes),
    }
    for role, accuracy in injected.items():
        acc = m[f"quality.probe.{role}_accuracy"]
        assert acc.interval is not None and acc.interval.contains(accuracy), (role, acc, accuracy)
    # Probes are the mirror's own traffic, never a client pair, and out of the divergence.
    assert review.data["pairs"] <= 140
    assert review.sections["divergence"]["candidate"]["pairs_sampled"] <= 140
