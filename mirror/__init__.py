"""The mirroring proxy (``shadow-ab mirror``): the incumbent's answers to the clients, shadow
copies to the candidate, one exchange record per engine answer.

Modules: ``app`` (the ASGI serving path), ``config`` (settings), ``sse`` / ``trace`` /
``recording`` (parsing and timing, pure), ``rewrite`` / ``sampling`` / ``headers`` (pure
decisions), ``guard``, ``health``, ``sinks`` / ``kafka_sink`` / ``spool``, ``metrics``,
``cli``. A subprocess mirror for tests and benchmarks: :mod:`shadow_ab.dev.processes`. See
mirror/README.md.

Errors: one tree under :class:`mirror.errors.MirrorError` (settings that cannot work, a spool
folder or Kafka sink that cannot start, a ``/metrics`` body that cannot be parsed).

Everything else the mirror meets (engines down, slow, answering errors) is recorded, not raised.
"""
