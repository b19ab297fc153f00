"""Timer: the step's time accounting."""

import pytest
from ember.trainer.timer import Timer


def test_a_timer_adds_the_time_of_each_block():
    timer = Timer()
    with timer:
        pass
    first = timer.seconds
    with timer:
        pass
    assert 0 < first < timer.seconds


def test_a_block_opened_inside_another_of_the_same_timer_is_refused():
    timer = Timer()
    with timer, pytest.raises(RuntimeError, match="do not nest"), timer:
        pass
    with timer:  # the outer block closed normally: the timer works on
        pass
