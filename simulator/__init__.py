"""An engine simulator with two flavors, vLLM and TensorRT-LLM, for tests, demo and benchmarks.

One configurable server (``shadow-ab sim``) that behaves like the real engines on the wire
(each flavor's request validation, stream framing, ``/metrics`` format) and in the ways that
matter to a shadow evaluation: deterministic greedy answers with consistent logprobs, a
continuous-batching latency model, a divergence knob, and injected faults, every one of them
written to a ledger so tests can check that the evaluator finds exactly what was injected.

Modules: :mod:`~simulator.scenario` (the YAML schema), :mod:`~simulator.generate` (what the
model answers), :mod:`~simulator.engine` (the scheduler), :mod:`~simulator.faults`,
:mod:`~simulator.ledger`, :mod:`~simulator.metrics`, :mod:`~simulator.wire` (each flavor's wire
format), :mod:`~simulator.server` (the aiohttp app), :mod:`~simulator.supervisor` and
:mod:`~simulator.child` (the restart-on-crash process pair). To start one from Python
(``running_sim``), see :mod:`shadow_ab.dev.processes`.

Errors::

    ScenarioError       a scenario file or mapping that cannot be used (says which key)
"""

from simulator.ledger import Incident, Injected, read_ledger, summarize
from simulator.scenario import Scenario, ScenarioError, load_scenario, shipped

__all__ = [
    "Incident",
    "Injected",
    "Scenario",
    "ScenarioError",
    "load_scenario",
    "read_ledger",
    "shipped",
    "summarize",
]
