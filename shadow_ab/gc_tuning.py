"""How the parts keep CPython's cyclic garbage collector cheap.

Every part allocates many short-lived objects freed by reference counting, and cycles are rare.
With CPython's defaults (thresholds 700, 10, 10) the collector runs a young collection every
700 allocations, and a full one each time the long-lived objects grew by a quarter, scanning
every tracked object alive: in a process that holds a few hundred MB of objects (a month's
review) that is a quarter of its CPU.

- :func:`tune_for_serving`: at a long-running process's start (the mirror, the ingester):
  collect once, freeze what is alive (modules, settings, clients) out of the collector's sight,
  and raise the thresholds for good.
- :func:`fewer_collections`: around one bounded piece of work in a process that also does other
  things (a review, in the report command or the query API): what is alive when it starts is
  frozen, young collections run every :data:`WORK_GEN0` allocations, full ones practically
  never; on leaving, the thresholds are restored and the frozen objects handed back to the
  collector (unless the process had frozen objects of its own before: then all stay frozen).
  Nested and concurrent uses (reviews in two threads) share one tuning, undone when
  the last one leaves. Cycles are still collected.

Measured on a 3 M-pair month (``bench/report.py --pairs 3000000 --days 30 --database D
--reuse-rollups``, alternating runs): the whole review's CPU 24.1 / 21.4 s with CPython's
defaults, 17.0 / 16.7 s frozen with thresholds (50,000, 20, 100), 15.9 s with the collector
off; with these thresholds (a full collection even rarer), 12.5-15.8 CPU s at 1, 3 and 10 M
pairs (docs/capacity.md).

Errors: none.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

WORK_GEN0 = 50_000
"""Allocations between young collections inside :func:`fewer_collections`."""

WORK_THRESHOLDS = (WORK_GEN0, 20, 1_000)
"""The collector's thresholds inside :func:`fewer_collections`: a full collection would need a
thousand middle-generation ones first (and the long-lived objects to grow by a quarter)."""

_lock = threading.Lock()
_holders = 0
_saved: tuple[int, int, int] = (700, 10, 10)
_froze = False


def tune_for_serving(gen0: int, gen1: int | None = None, gen2: int | None = None) -> None:
    """Collect once, freeze what is alive, and set the thresholds (``None``: keep CPython's)."""
    gc.collect()
    gc.freeze()
    _, old1, old2 = gc.get_threshold()
    gc.set_threshold(gen0, old1 if gen1 is None else gen1, old2 if gen2 is None else gen2)


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Collect seldom while the block runs (see the module's text); restored on leaving."""
    global _holders, _saved, _froze
    with _lock:
        if _holders == 0:
            _saved = gc.get_threshold()
            # a process tuned for serving froze its own objects: leave them frozen
            _froze = gc.get_freeze_count() == 0
            if _froze:
                gc.freeze()
            gc.set_threshold(*WORK_THRESHOLDS)
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                gc.set_threshold(*_saved)
                if _froze:
                    gc.unfreeze()
