"""The budget of fault exits of a supervised shard, kept beside its log."""

import json

import pytest
from ember.ps_server.durability.fault_exits import (
    FAULT_EXIT_WINDOW_S,
    MAX_FAULT_EXITS,
    FaultExits,
)

from tests.support.manual_clock import ManualClock


def test_exits_are_allowed_up_to_the_budget_per_window_and_outlive_the_process(tmp_path):
    clock = ManualClock(1_000_000.0)
    for _ in range(MAX_FAULT_EXITS):
        assert FaultExits(tmp_path, 3, clock).take() is None  # a new process each time
        clock.now += 1.0
    refusal = FaultExits(tmp_path, 3, clock).take()
    assert refusal is not None and f"{MAX_FAULT_EXITS} times" in refusal
    assert FaultExits(tmp_path, 4, clock).take() is None  # another shard's own budget
    clock.now += FAULT_EXIT_WINDOW_S  # the old exits leave the window
    assert FaultExits(tmp_path, 3, clock).take() is None
    assert json.loads((tmp_path / "shard-3.fault-exits.json").read_text()) == [clock.now]


@pytest.mark.parametrize("content", [b"{not json", b'{"a": 1}', b'["soon"]', b"[true]"])
def test_a_record_that_cannot_be_read_leaves_the_decision_to_an_operator(tmp_path, content):
    (tmp_path / "shard-0.fault-exits.json").write_bytes(content)
    refusal = FaultExits(tmp_path, 0).take()
    assert refusal is not None and "cannot read" in refusal


def test_an_exit_that_cannot_be_recorded_is_not_taken(tmp_path):
    refusal = FaultExits(tmp_path / "missing", 0).take()
    assert refusal is not None and "cannot record" in refusal
