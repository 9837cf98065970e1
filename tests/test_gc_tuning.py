"""shadow_ab.gc_tuning: the collector's tuning around a review is undone when it ends, shared by
nested and concurrent reviews, and leaves a serving process's frozen objects frozen."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from shadow_ab.gc_tuning import WORK_THRESHOLDS, fewer_collections, tune_for_serving


@pytest.fixture(autouse=True)
def _restore_gc() -> Iterator[None]:
    before = gc.get_threshold()
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_inside_the_block_collections_are_rare_and_alive_objects_frozen() -> None:
    gc.set_threshold(700, 10, 10)
    alive = [object() for _ in range(10)]
    with fewer_collections():
        assert gc.get_threshold() == WORK_THRESHOLDS
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0
    assert alive


def test_the_tuning_is_undone_on_an_exception() -> None:
    gc.set_threshold(900, 11, 12)
    with pytest.raises(RuntimeError), fewer_collections():
        raise RuntimeError("the review failed")
    assert gc.get_threshold() == (900, 11, 12)
    assert gc.get_freeze_count() == 0


def test_nested_and_concurrent_blocks_share_one_tuning() -> None:
    gc.set_threshold(700, 10, 10)
    entered = threading.Event()
    leave = threading.Event()
    seen: list[tuple[int, int, int]] = []

    def other_review() -> None:
        with fewer_collections():
            entered.set()
            leave.wait(10)
        seen.append(gc.get_threshold())

    worker = threading.Thread(target=other_review)
    with fewer_collections():
        worker.start()
        assert entered.wait(10)
        with fewer_collections():
            pass
        assert gc.get_threshold() == WORK_THRESHOLDS  # the inner block left it tuned
    # the other review still runs: still tuned
    assert gc.get_threshold() == WORK_THRESHOLDS
    assert gc.get_freeze_count() > 0
    leave.set()
    worker.join(10)
    assert seen == [(700, 10, 10)]
    assert gc.get_freeze_count() == 0


def test_a_serving_process_frozen_objects_stay_frozen() -> None:
    gc.freeze()
    assert gc.get_freeze_count() > 0
    with fewer_collections():
        pass
    assert gc.get_freeze_count() > 0  # unfreezing would have left none


def test_tune_for_serving_freezes_and_sets_the_thresholds_it_is_given() -> None:
    gc.set_threshold(700, 11, 12)
    tune_for_serving(10_000)
    assert gc.get_threshold() == (10_000, 11, 12)  # the others kept
    assert gc.get_freeze_count() > 0
    tune_for_serving(20_000, 30, 40)
    assert gc.get_threshold() == (20_000, 30, 40)
