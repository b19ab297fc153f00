"""A training loop's window over its batches: each batch announced once, in order, up to the
source's lookahead and never past the run's last step; plans taken by identity."""

import collections
import threading

import pytest
from ember.trainer.lookahead import Lookahead, take_planned


def run(batches, depth, steps, background=False):
    """What a loop of ``steps`` steps announces after each step's batch: [(batch, announced)]."""
    announced, seen = [], []
    with Lookahead(iter(batches), depth, steps, announced.append, background) as ahead:
        for _ in range(steps):
            batch = ahead.take()
            if batch is None:
                break
            ahead.announce()
            ahead.settle()
            seen.append((batch, list(announced)))
            announced.clear()
    return seen


@pytest.mark.parametrize("background", [False, True])
def test_each_batch_is_announced_once_in_order_depth_steps_early(background):
    assert run(range(6), depth=2, steps=6, background=background) == [
        (0, [1, 2]), (1, [3]), (2, [4]), (3, [5]), (4, []), (5, []),
    ]  # fmt: skip
    assert run(range(4), 1, 4, background) == [(0, [1]), (1, [2]), (2, [3]), (3, [])]


@pytest.mark.parametrize("background", [False, True])
def test_nothing_past_the_last_step_or_the_last_batch_is_announced(background):
    assert run(range(10), 3, 3, background) == [(0, [1, 2]), (1, []), (2, [])]
    assert run(range(2), 3, 5, background) == [(0, [1]), (1, [])]
    assert run([], 2, 5, background) == []


def test_background_planning_runs_beside_the_step_and_settle_waits_for_it():
    release, planned, threads = threading.Event(), [], []

    def plan(batch):
        threads.append(threading.current_thread().name)
        assert release.wait(timeout=30)  # held until the "step's compute" lets it go
        planned.append(batch)

    with Lookahead(iter(range(4)), 2, 4, plan, background=True) as ahead:
        assert ahead.take() == 0
        ahead.announce()  # returns while batch 1's planning is held
        assert planned == []
        release.set()
        ahead.settle()
        assert planned == [1, 2]
    assert threads and all(name.startswith("ember-plan") for name in threads)


def test_a_planning_error_is_raised_by_settle_and_by_the_next_take():
    calls = []

    def plan(batch):
        calls.append(batch)
        raise ValueError(f"bad ids in batch {batch}")

    ahead = Lookahead(iter(range(4)), 1, 4, plan, background=True)
    ahead.take()
    ahead.announce()  # the error is the planning thread's, not announce's
    with pytest.raises(ValueError, match="batch 1"):
        ahead.settle()
    ahead.announce()  # batch 1 counts as announced: nothing is planned twice
    ahead.close()
    assert calls == [1]
    ahead = Lookahead(iter(range(4)), 1, 4, plan, background=True)
    ahead.take()
    ahead.announce()
    with pytest.raises(ValueError, match="batch 1"):
        ahead.take()
    ahead.close()


def test_announcing_again_first_raises_the_planning_error_of_the_batches_before():
    def plan(batch):
        if batch == 1:
            raise ValueError("bad ids in batch 1")

    with Lookahead(iter(range(4)), 1, 4, plan, background=True) as ahead:
        ahead.take()
        ahead.announce()  # batch 1, whose planning fails
        with pytest.raises(ValueError, match="batch 1"):
            ahead.announce()  # not lost behind batch 2's


def test_leaving_the_block_waits_for_the_planning_and_raises_its_error_only_when_no_other():
    release, planned = threading.Event(), []

    def plan(batch):
        assert release.wait(timeout=30)
        planned.append(batch)
        raise ValueError("planning failed")

    with (
        pytest.raises(KeyError) as raised,  # the block's own error is the one raised
        Lookahead(iter(range(3)), 1, 3, plan, background=True) as ahead,
    ):
        ahead.take()
        ahead.announce()
        release.set()
        raise KeyError("the step failed")
    assert planned == [1]  # the planning had finished when the block was left
    assert "planning the next steps also failed" in "".join(raised.value.__notes__)
    with (
        pytest.raises(ValueError, match="planning failed"),
        Lookahead(iter(range(3)), 1, 3, plan, background=True) as ahead,
    ):
        ahead.take()
        ahead.announce()


def test_a_depth_below_one_is_refused():
    with pytest.raises(ValueError, match="depth must be >= 1"):
        Lookahead(iter([]), 0, 1, print)


def test_take_planned_drops_older_plans_and_keeps_later_ones():
    planned = collections.deque(["a", "b", "c"])
    assert take_planned(planned, lambda p: p == "b") == "b"
    assert list(planned) == ["c"]
    assert take_planned(planned, lambda p: p == "x") is None
    assert list(planned) == ["c"]  # nothing matched: nothing dropped
