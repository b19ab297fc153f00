"""The step data plane on one shard, in process: clocks, exact sums, limits and refreshes
(the rows and state written into replies: test_step_rows; waits that end early:
test_step_waits)."""

import time

import numpy as np
import pytest
from ember.ps_server.errors import (
    ClockTimeoutError,
    InvalidArgumentError,
    MessageTooLargeError,
    OutOfRangeError,
    Status,
    TooManyWaitingError,
    status_for,
)
from ember.ps_server.shard.initializers import initial_rows
from ember.ps_server.shard.server import ParameterServer
from ember.ps_server.shard.step_handlers import StepHandlers
from ember.ps_server.wire.messages import pb
from ember.ps_server.wire.row_dtype import RowDtype
from ember.ps_server.wire.step_codec import (
    decode_lookup_request,
    decode_lookup_response,
    decode_update_request,
    decode_update_response,
    encode_lookup_request,
    encode_update_request,
)
from ember.ps_server.wire.table_spec import TableSpec

from tests.support.steps_in_process import (
    ADAM,
    OTHER,
    clock,
    in_thread,
    lookup,
    reference_rows,
    shard,
    update,
    update_and_read,
)  # fmt: skip


def test_exact_mode_applies_the_sum_of_every_rank_as_one_step_per_row_per_clock():
    server = shard()
    g0, g1 = np.full((2, 3), 0.3), np.full((2, 3), -0.1)
    first, result = in_thread(update, server, 0, [4, 9], g0, rank=0)
    assert server.steps.clocks.job(clock(0)).await_waiters(1, 30)  # held for rank 1
    assert "value" not in result
    duplicate, _, watermark = update(server, 0, [9, 4], g1[::-1], rank=1)
    first.join(30)
    assert result["value"][0] is False and duplicate is False and watermark == 0
    rows, _ = lookup(server, [4, 9])
    np.testing.assert_allclose(rows, reference_rows([4, 9], [g0 + g1]), rtol=1e-5, atol=1e-6)
    assert server.pull("emb", np.array([4, 9], "<i8").tobytes()).versions.tolist() == [1, 1]


def test_an_exact_clock_steps_a_table_only_one_rank_sent_once_with_that_ranks_gradients():
    server = shard()
    g0 = np.full((2, 3), 0.3)
    first, result = in_thread(update, server, 0, [4, 9], g0, rank=0)
    assert server.steps.clocks.job(clock(0)).await_waiters(1, 30)  # held for rank 1
    other = encode_update_request(
        [("other", np.array([7], "<i8"), np.full((1, 2), 0.2, "<f4"))], clock(0, rank=1)
    )
    server.steps.update(decode_update_request(other), None)
    first.join(30)
    assert "error" not in result
    rows, _ = lookup(server, [4, 9])
    np.testing.assert_allclose(rows, reference_rows([4, 9], [g0]), rtol=1e-5, atol=1e-6)
    pulled = server.pull("other", np.array([7], "<i8").tobytes())
    expected = initial_rows(OTHER, np.array([7])).numpy().astype(np.float64) - 0.5 * 0.2  # SGD
    np.testing.assert_allclose(pulled.values, expected, rtol=1e-6)
    assert pulled.versions.tolist() == [1]
    assert server.pull("emb", np.array([4, 9], "<i8").tobytes()).versions.tolist() == [1, 1]


def test_async_mode_steps_once_per_rank_update():
    server = shard()
    g0, g1 = np.full((1, 3), 0.3), np.full((1, 3), -0.1)
    update(server, 0, [4], g0, rank=0, mode=pb.ASYNC)
    update(server, 0, [4], g1, rank=1, mode=pb.ASYNC)
    rows, watermark = lookup(server, [4], step=0, mode=pb.ASYNC)
    assert watermark == 0
    np.testing.assert_allclose(rows, reference_rows([4], [g0, g1]), rtol=1e-5, atol=1e-6)


def test_a_lookup_waits_until_every_rank_delivered_its_clock():
    server = shard()
    update_0, _ = in_thread(update, server, 0, [4], np.ones((1, 3)), rank=0)
    waiting, looked = in_thread(lookup, server, [4], step=0, rank=0)
    assert server.steps.clocks.job(clock(0)).await_waiters(2, 30)  # rank 0's update and lookup
    assert "value" not in looked
    update(server, 0, [4], np.ones((1, 3)), rank=1)
    waiting.join(30)
    update_0.join(30)
    rows, watermark = looked["value"]
    assert watermark == 0
    np.testing.assert_allclose(rows, reference_rows([4], [np.full((1, 3), 2.0)]), rtol=1e-5)


def test_a_missing_rank_fails_the_wait_naming_it_and_no_clock_is_applied_in_part():
    server = shard()
    with pytest.raises(ClockTimeoutError, match=r"rank\(s\) 1 have not delivered clock 0"):
        update(server, 0, [4], np.ones((1, 3)), rank=0, wait_ms=50)
    with pytest.raises(ClockTimeoutError, match=r"rank\(s\) 0, 1 have not delivered clock 3"):
        lookup(server, [4], step=3, wait_ms=50)
    assert server.pull("emb", np.array([4], "<i8").tobytes()).versions.tolist() == [0]


def test_a_repeated_clock_is_a_duplicate_and_clocks_apply_in_order():
    server = shard()
    later, result = in_thread(update, server, 1, [4], np.ones((1, 3)), world=1)
    assert server.steps.clocks.job(clock(1, world=1)).await_waiters(1, 30)
    assert "value" not in result  # clock 1 waits for clock 0
    assert update(server, 0, [4], np.ones((1, 3)), world=1)[0] is False
    later.join(30)
    assert result["value"][0] is False
    assert update(server, 1, [4], np.ones((1, 3)), world=1)[0] is True  # a retry
    assert server.pull("emb", np.array([4], "<i8").tobytes()).versions.tolist() == [2]


def test_an_update_returns_the_refresh_rows_its_clock_changed():
    server = shard()
    duplicate, refreshed, _ = update(server, 0, [4, 9], np.ones((2, 3)), world=1,
                                     refresh=[[1, 9, 7, 4]])  # fmt: skip
    assert duplicate is False
    ((positions, rows, dtype),) = refreshed
    assert dtype == RowDtype.FLOAT32
    assert positions.tolist() == [1, 3]  # 9 and 4 changed; 1 and 7 did not
    np.testing.assert_array_equal(rows, lookup(server, [9, 4])[0])


def test_a_read_riding_on_an_update_is_answered_once_every_ranks_clock_is_applied():
    server = shard()
    g0, g1 = np.full((2, 3), 0.3), np.full((2, 3), -0.1)
    first, result = in_thread(update_and_read, server, 0, [4, 9], g0, [9, 5, 4, 9], rank=0)
    assert server.steps.clocks.job(clock(0)).await_waiters(1, 30)  # held for rank 1
    assert "value" not in result
    update(server, 0, [4, 9], g1, rank=1)
    first.join(30)
    watermark, rows = result["value"]
    assert watermark == 0
    np.testing.assert_array_equal(rows, lookup(server, [9, 5, 4, 9])[0])  # both ranks' sum
    summed = reference_rows([9, 4], [g0 + g1])
    np.testing.assert_allclose(rows[[0, 2, 3]], summed[[0, 1, 0]], rtol=1e-5, atol=1e-6)


def test_an_updates_read_state_answers_versions_then_optimizer_state_once_it_is_applied():
    server = shard()
    update(server, 0, [4, 9], np.full((2, 3), 0.5), world=1)
    ids = np.array([9, 2, 4], "<i8")  # 2 was never written
    request = encode_update_request(
        [("emb", ids[[0, 2]], np.full((2, 3), -0.25, "<f4"))], clock(1, world=1),
        read_state=[("emb", ids)],
    )  # fmt: skip
    reply = decode_update_response(StepHandlers(server).update(decode_update_request(request)))
    counters = {s.name: s.counters for s in server.stats()}["emb"]  # state: not a pull
    assert (counters.pull_requests, counters.rows_pulled) == (0, 0)
    stored = server.pull("emb", ids.tobytes(), with_state=True)  # after clock 1
    assert np.frombuffer(reply.state, "<i8", 3).tolist() == [2, 0, 2] == stored.versions.tolist()
    state = np.frombuffer(reply.state, "<f4", offset=24).reshape(3, 6)  # Adam: m, then v
    np.testing.assert_array_equal(state, stored.state)
    assert state[1].tolist() == [0.0] * 6 and state[0].any()


def test_a_read_state_alone_wider_than_a_row_is_refused_before_anything_is_applied():
    """An Adam row's state is 2 + 6 words against a read row's 3: 2100 ids' rows would fit
    under 64 KiB (26 KB), their state (68 KB) does not."""
    server = ParameterServer(0, 1, max_message_bytes=1 << 16)
    server.create_table(ADAM)
    ids = np.arange(2100, dtype="<i8")
    request = encode_update_request(
        [("emb", ids[:1], np.ones((1, 3), "<f4"))], clock(0, world=1),
        read_state=[("emb", ids)],
    )  # fmt: skip
    with pytest.raises(MessageTooLargeError, match="a read of 2100 ids from table 'emb'"):
        server.steps.update(decode_update_request(request))
    assert server.pull("emb", ids[:1].tobytes()).versions.tolist() == [0]


def test_each_read_is_charged_the_width_its_reply_carries():
    """Under 64 KiB: an SGD row of dim 1000 has no state, so 20 ids' versions (160 bytes)
    fit, though 20 of its rows (80 KB) would not; a lookup row is its weights alone, so
    1100 rows of dim 14 (61.6 KB) fit and 1200 (67.2 KB) do not."""
    server = ParameterServer(0, 1, max_message_bytes=1 << 16)
    server.create_table(TableSpec("wide", dim=1000))
    server.create_table(TableSpec("narrow", dim=14))
    ids = np.arange(1200, dtype="<i8")
    request = encode_update_request(
        [("wide", ids[:1], np.ones((1, 1000), "<f4"))], clock(0, world=1),
        read_state=[("wide", ids[:20])],
    )  # fmt: skip
    reply = decode_update_response(StepHandlers(server).update(decode_update_request(request)))
    assert len(reply.state) == 20 * 8

    def lookup(table, count):
        request = encode_lookup_request([(table, ids[:count])], None)
        return StepHandlers(server).lookup(decode_lookup_request(request))

    with pytest.raises(MessageTooLargeError, match="a read of 20 ids from table 'wide'"):
        lookup("wide", 20)
    assert len(decode_lookup_response(lookup("narrow", 1100)).values[0]) == 1100 * 14 * 4
    with pytest.raises(MessageTooLargeError, match="a read of 1200 ids from table 'narrow'"):
        lookup("narrow", 1200)


def test_a_read_row_beyond_its_dtype_fails_the_answer_and_the_clock_stays_applied():
    server = shard()
    ids = np.array([3, 8], "<i8")
    request = encode_update_request(
        [("other", ids, np.full((2, 2), -3e5, "<f4"))], clock(0, world=1),
        read=[("other", ids, RowDtype.FLOAT16)],  # SGD lr 0.5: rows near 1.5e5 > 65504
    )  # fmt: skip
    with pytest.raises(OutOfRangeError, match="float16"):
        StepHandlers(server).update(decode_update_request(request))
    assert server.pull("other", ids.tobytes()).versions.tolist() == [1, 1]
    assert update(server, 0, [4], np.ones((1, 3)), world=1)[0] is True  # a retry: a duplicate


def test_a_read_riding_on_an_async_update_is_refused_before_anything_is_applied():
    server = shard()
    with pytest.raises(InvalidArgumentError, match="read needs EXACT mode"):
        update_and_read(server, 0, [4], np.ones((1, 3)), [4], world=1, mode=pb.ASYNC)
    request = encode_update_request(
        [("emb", np.array([4], "<i8"), np.ones((1, 3), "<f4"))],
        clock(0, world=1, mode=pb.ASYNC), read_state=[("emb", np.array([4], "<i8"))],
    )  # fmt: skip
    with pytest.raises(InvalidArgumentError, match="read needs EXACT mode"):
        server.steps.update(decode_update_request(request))
    assert server.pull("emb", np.array([4], "<i8").tobytes()).versions.tolist() == [0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rank": 2}, "rank must be in 0..world-1"),
        ({"job": ""}, "clock.job must be"),
        ({"wait_ms": 0}, "wait_ms must be in"),
        ({"mode": 0}, "mode must be EXACT or ASYNC"),
        ({"world": 2**32 - 1}, "world in 1..65536"),  # would allocate a clock per rank
    ],
)
def test_bad_clocks_are_refused(change, message):
    server = shard()
    arguments = {"rank": 0, "job": "job-a", "wait_ms": 100, "mode": pb.EXACT, **change}
    with pytest.raises(InvalidArgumentError, match=message):
        update(server, 0, [4], np.ones((1, 3)), **arguments)


def test_bad_updates_are_refused_before_anything_is_buffered():
    server = shard()
    bad_clock = encode_update_request([("emb", np.array([4], "<i8"), np.ones((1, 3), "<f4"))], None)
    with pytest.raises(InvalidArgumentError, match="needs a clock"):
        server.steps.update(decode_update_request(bad_clock))
    with pytest.raises(InvalidArgumentError, match="NaN or Inf"):
        update(server, 0, [4], np.full((1, 3), np.nan))
    twice = encode_update_request(
        [("emb", np.array([4], "<i8"), np.ones((1, 3), "<f4"))] * 2, clock(0)
    )
    with pytest.raises(InvalidArgumentError, match="more than once"):
        server.steps.update(decode_update_request(twice))
    lookup(server, [4], step=-1)  # the job begins, with 2 ranks
    with pytest.raises(InvalidArgumentError, match="runs 2 rank"):
        update(server, 0, [4], np.ones((1, 3)), world=3)  # the job began with world 2
    assert not server.steps.clocks.job(clock(0)).pending


def test_a_request_naming_one_table_many_times_is_refused_in_linear_time():
    # ~1 MB of a 2-character table named 150,000 times: a check that counts each name's
    # repeats by scanning the list takes minutes, one worker held all the while.
    request = encode_lookup_request([("ab", np.array([4], "<i8"))] * 150_000, clock(0))
    decoded = decode_lookup_request(request)
    started = time.perf_counter()
    with pytest.raises(InvalidArgumentError, match="more than once: 'ab'"):
        StepHandlers(shard()).lookup(decoded)
    assert time.perf_counter() - started < 5


def test_a_clock_far_past_the_watermark_is_refused_before_it_is_buffered():
    server = shard()
    with pytest.raises(InvalidArgumentError, match="more than 1024 clocks past"):
        update(server, 10**12, [4], np.ones((1, 3)))
    assert server.steps.clocks.job(clock(0)).pending == {}
    # Nor does a refused update that says it holds replicas count its job as a replica job
    # (a counted job that never reports holds up every checkpoint's flush).
    ghost = encode_update_request([], clock(5000, world=1, job="ghost"), replica=True)
    with pytest.raises(InvalidArgumentError, match="more than 1024 clocks past"):
        server.steps.update(decode_update_request(ghost))
    assert server.steps.replicas.jobs() == []
    server.steps.update(
        decode_update_request(
            encode_update_request([], clock(0, world=1, job="ghost"), replica=True)
        )
    )
    assert server.steps.replicas.jobs() == ["ghost"]


def test_a_lookup_of_a_clock_no_update_could_reach_is_refused_without_waiting():
    server = shard()
    with pytest.raises(InvalidArgumentError, match="lookup of clock 1025 is more than 1024"):
        lookup(server, [4], step=1025, wait_ms=50)
    assert server.steps.clocks.job(clock(0)).waiters == 0


def test_waits_beyond_the_shards_limit_are_refused_and_calls_that_need_no_wait_go_on():
    """Each waiting request holds a worker thread: past the shard's limit a request that would
    wait is refused at once (RESOURCE_EXHAUSTED; an update is withdrawn), requests that are
    ready need no slot, and a wait that ends gives its slot back."""
    server = ParameterServer(0, 1, max_waiting=2)
    server.create_table(ADAM)
    parked = [in_thread(lookup, server, [4], step=0, rank=r, mode=pb.ASYNC) for r in (0, 1)]
    job = server.steps.clocks.job(clock(0, mode=pb.ASYNC))
    assert job.await_waiters(2, 30)
    with pytest.raises(TooManyWaitingError, match="2 requests already wait") as refused:
        lookup(server, [4], step=0, mode=pb.ASYNC)
    assert status_for(refused.value) is Status.RESOURCE_EXHAUSTED
    with pytest.raises(TooManyWaitingError):  # an exact update waits for the other rank's
        update(server, 0, [4], np.ones((1, 3)), rank=0, job="job-x")
    assert server.steps.clocks.job(clock(0, job="job-x")).pending == {}  # never applied
    assert lookup(server, [4], step=-1, mode=pb.ASYNC)[1] == -1  # ready: no slot needed
    for rank in (0, 1):  # async updates of clock 0 wait for nothing
        update(server, 0, [4], np.ones((1, 3)), rank=rank, mode=pb.ASYNC)
    for thread, result in parked:
        thread.join(30)
        assert result["value"][1] == 0
    with pytest.raises(ClockTimeoutError):  # admitted again: it waits, then times out
        lookup(server, [4], step=1, mode=pb.ASYNC, wait_ms=20)


def test_a_timeout_names_at_most_ten_ranks_however_many_the_job_has():
    server = shard()
    with pytest.raises(ClockTimeoutError) as timed_out:
        lookup(server, [4], step=0, world=5000, wait_ms=20, job="wide")
    message = str(timed_out.value)
    assert "rank(s) 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 and 4990 more" in message
    assert "applied clocks from -1 to -1 over 5000 ranks" in message and len(message) < 400


def test_a_forgotten_job_comes_back_with_its_clocks_and_its_world():
    from ember.ps_server.shard import step_clocks

    clocks = step_clocks.StepClocks()
    job = clocks.job(clock(0, world=2))
    job.mark_applied(0, 7)
    for n in range(step_clocks.MAX_JOBS):  # newer jobs push it out
        clocks.job(clock(0, world=1, job=f"other-{n}"))
    assert "job-a" in clocks.snapshot()  # retired, still in checkpoints and cuts
    assert clocks.cut_reached({"job-a": [7, 7]})()
    with pytest.raises(InvalidArgumentError, match="runs 2 rank"):
        clocks.job(clock(0, world=3))  # refused, and the retired clocks stay
    assert clocks.job(clock(0, world=2)).applied == [7, 7]


def test_a_job_in_use_is_never_forgotten_as_idle():
    """A request between looking its job up and taking its condition marks it busy in no
    other way: were the job forgotten then, its clocks would go to a copy nobody sees."""
    from ember.ps_server.shard import step_clocks

    clocks = step_clocks.StepClocks()

    def crowd_out(prefix: str) -> None:
        for n in range(step_clocks.MAX_JOBS + 1):
            clocks.job(clock(0, world=1, job=f"{prefix}-{n}"))

    with clocks.using(clock(0)) as job:
        crowd_out("during")
        assert clocks.job(clock(0)) is job
    with pytest.raises(InvalidArgumentError, match="runs 2 rank"), clocks.using(clock(0, world=3)):
        pass  # refused without counting as a use
    crowd_out("after")
    assert "job-a" not in clocks.applied_by_job()  # idle now: forgotten
