"""Development tooling: it imports every part, and no part imports it.

:mod:`~shadow_ab.dev.demo` (``shadow-ab demo``), :mod:`~shadow_ab.dev.traffic` (the client
traffic generator), :mod:`~shadow_ab.dev.services` (``shadow-ab services``: a local Kafka and
PostgreSQL), :mod:`~shadow_ab.dev.processes` (simulators and mirrors as subprocesses, for the
demo, the benchmarks and the tests), :mod:`~shadow_ab.dev.synthetic` (records with every field
filled in, for the benchmarks and the tests), :mod:`~shadow_ab.dev.engines` (``shadow-ab
engine``: real vLLM's CPU build on a tiny model made here, for the real-engine tests).
"""
