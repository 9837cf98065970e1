"""The record step every exchange ends in: counted, made private, handed to the sink.

:class:`Recorder` is what the client's path (:mod:`mirror.exchange`), the shadow side
(:mod:`mirror.shadow`) and the probes share at the end of an exchange:
:meth:`Recorder.record` counts it (``shadow_ab_mirror_upstream_requests_total``, the TTFT and
E2E histograms), builds its :class:`~shadow_ab.records.ExchangeRecord`, applies the privacy
level (:mod:`mirror.privacy`) and hands it to the sink without blocking. :class:`InFlight` holds
the requests in flight per role (the load parity's inputs and the records' ``inflight_*``).

Errors: none raised; a record that cannot be built or redacted is dropped, logged and counted
(``shadow_ab_mirror_records_dropped_total``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from mirror import metrics as m
from mirror.privacy import Privacy, PrivacyConfig, RedactionError
from mirror.recording import Dispatch, build_record
from shadow_ab.records import ExchangeRecord, Role, Status

if TYPE_CHECKING:
    from mirror.sinks import RecordSink
    from mirror.trace import Outcome

log = logging.getLogger(__name__)


class InFlight:
    """Engine requests in flight per role, mirrored in ``shadow_ab_mirror_inflight``."""

    __slots__ = ("_gauge", "counts")

    def __init__(self) -> None:
        self.counts = {r: 0 for r in Role}
        self._gauge = {r: m.INFLIGHT.labels(role=r.value) for r in Role}

    def __getitem__(self, role: Role) -> int:
        return self.counts[role]

    def start(self, role: Role) -> None:
        self.counts[role] += 1
        self._gauge[role].inc()

    def end(self, role: Role) -> None:
        self.counts[role] -= 1
        self._gauge[role].dec()

    def incumbent_load(self) -> int:
        """The incumbent's requests in flight: the clients' and the replays'."""
        return self.counts[Role.INCUMBENT] + self.counts[Role.REPLAY]


class Recorder:
    """Counts each exchange and hands its record to ``sink`` (see the module docstring)."""

    def __init__(self, deployment: str, sink: RecordSink, privacy: PrivacyConfig) -> None:
        self.deployment = deployment
        self.sink = sink
        self.privacy = Privacy(privacy)
        self.inflight = InFlight()
        self._sink_label = sink.label
        # Metric children looked up once (labels() costs microseconds per call).
        self._m_ttft = {r: m.TTFT.labels(role=r.value) for r in Role}
        self._m_e2e = {r: m.E2E.labels(role=r.value) for r in Role}
        self._m_upstream: dict[tuple[Role, Status], Any] = {
            (r, s): m.UPSTREAM_REQUESTS.labels(role=r.value, status=s.value)
            for r in Role
            for s in Status
        }
        self._m_records = m.RECORDS.labels(sink=self._sink_label, kind="exchange")

    def record(
        self,
        d: Dispatch,
        status: Status,
        outcome: Outcome,
        http_status: int | None,
        error: str | None,
    ) -> None:
        """Count the exchange and hand its record to the sink (never raises)."""
        role = d.role
        self._m_upstream[(role, status)].inc()
        if outcome.ttft_s is not None:
            self._m_ttft[role].observe(outcome.ttft_s)
        if outcome.e2e_s is not None and status is Status.OK:
            self._m_e2e[role].observe(outcome.e2e_s)
        try:
            record: ExchangeRecord = build_record(
                self.deployment,
                d,
                status=status,
                outcome=outcome,
                http_status=http_status,
                error=error,
            )
        except Exception:
            log.exception("could not build the %s record of pair %s", role.value, d.pair_id)
            m.RECORDS_DROPPED.labels(reason="encode_error").inc()
            return
        try:
            if d.synthetic is None:  # a probe's text is the mirror's own, not a client's
                record = self.privacy.apply(record, d.capture)
        except RedactionError as exc:
            log.error(
                "the redactor failed on the %s record of pair %s: %s", role.value, d.pair_id, exc
            )
            m.RECORDS_DROPPED.labels(reason="redactor_error").inc()
            return
        try:
            accepted = self.sink.submit(record)
        except Exception:
            log.exception("the sink refused a record")
            accepted = False
        if accepted:
            if self._sink_label == "direct":
                self._m_records.inc()
        elif self._sink_label == "direct":
            m.RECORDS_DROPPED.labels(reason="sink_refused").inc()
