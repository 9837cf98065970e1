"""Incidents: crashes, version changes, leaks, error bursts and hangs found in the store's data.

The pipeline, one module per stage:

- :mod:`.model`: the thresholds (:class:`IncidentConfig`), one incident (:class:`Finding`)
  and what detection reads (:class:`DetectionInput`), as plain values;
- :mod:`.load`: the SQL that reads a deployment's window into a :class:`DetectionInput`;
- :mod:`.restarts`: crashes and version changes from the health samples;
- :mod:`.exchanges` (with :mod:`.leak`): error bursts, hangs and leaks;
- :mod:`.analysis`: :func:`detect_incidents` (pure) and the review's section
  (:func:`incident_section`);
- :mod:`.store`: :func:`store_incidents` writes findings, idempotently;
- :mod:`.query`: reading stored incidents back (the CLI and the API);
- :mod:`.cli`: ``shadow-ab incidents``.

Detection neither reads nor writes the store; the caller loads, detects and stores::

    data = load_detection_input(engine, deployment, window, config)
    findings = detect_incidents(data, config)
    store_incidents(engine, deployment, findings)

Each :class:`Finding` carries its evidence (counts, samples, statistics) as a JSON-able dict.
Store failures surface as :class:`storage.errors.StorageError`.
"""

from evaluator.incidents.analysis import IncidentSection, detect_incidents, incident_section
from evaluator.incidents.load import load_detection_input
from evaluator.incidents.model import KINDS, Finding, IncidentConfig
from evaluator.incidents.restarts import warmup_windows
from evaluator.incidents.store import store_incidents

__all__ = [
    "KINDS",
    "Finding",
    "IncidentConfig",
    "IncidentSection",
    "detect_incidents",
    "incident_section",
    "load_detection_input",
    "store_incidents",
    "warmup_windows",
]
