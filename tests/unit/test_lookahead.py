"""A training loop's window over its batches: each batch announced once, in order, up to the
source's lookahead and never past the run's last step; plans taken by identity."""

import collections

import pytest
from ember.trainer.lookahead import Lookahead, take_planned


def run(batches, depth, steps):
    """What a loop of ``steps`` steps announces after each step's batch: [(batch, announced)]."""
    announced, seen = [], []
    ahead = Lookahead(iter(batches), depth, steps, announced.append)
    for _ in range(steps):
        batch = ahead.take()
        if batch is None:
            break
        ahead.announce()
        seen.append((batch, list(announced)))
        announced.clear()
    return seen


def test_each_batch_is_announced_once_in_order_depth_steps_early():
    assert run(range(6), depth=2, steps=6) == [
        (0, [1, 2]), (1, [3]), (2, [4]), (3, [5]), (4, []), (5, []),
    ]  # fmt: skip
    assert run(range(4), depth=1, steps=4) == [(0, [1]), (1, [2]), (2, [3]), (3, [])]


def test_nothing_past_the_last_step_or_the_last_batch_is_announced():
    assert run(range(10), depth=3, steps=3) == [(0, [1, 2]), (1, []), (2, [])]
    assert run(range(2), depth=3, steps=5) == [(0, [1]), (1, [])]
    assert run([], depth=2, steps=5) == []


def test_a_depth_below_one_is_refused():
    with pytest.raises(ValueError, match="depth must be >= 1"):
        Lookahead(iter([]), 0, 1, print)


def test_take_planned_drops_older_plans_and_keeps_later_ones():
    planned = collections.deque(["a", "b", "c"])
    assert take_planned(planned, lambda p: p == "b") == "b"
    assert list(planned) == ["c"]
    assert take_planned(planned, lambda p: p == "x") is None
    assert list(planned) == ["c"]  # nothing matched: nothing dropped
