import json
import threading

import numpy as np
import pytest
from ember.ps_server.durability.checkpoint_format import read_row_file
from ember.ps_server.errors import (
    InvalidArgumentError,
    MessageTooLargeError,
    NotOwnedError,
    PermissionDeniedError,
    ShardFailedError,
    TableExistsError,
    TableNotFoundError,
)
from ember.ps_server.routing import shard_of
from ember.ps_server.shard.initializers import initial_rows
from ember.ps_server.shard.server import ParameterServer
from ember.ps_server.wire.messages import encode_ids
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec

from tests.support.reference import ReferenceRow

SPEC = TableSpec("t", dim=4, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=0.5))


def _server(**kwargs) -> ParameterServer:
    server = ParameterServer(shard=0, num_shards=1, **kwargs)
    server.create_table(SPEC)
    return server


def _grads(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, SPEC.dim)).astype(np.float32)


def test_pull_of_unwritten_ids_reads_initial_rows_in_request_order_and_stores_nothing():
    server = _server()
    ids = np.array([9, 3, 9, 0], dtype=np.int64)
    reply = server.pull("t", encode_ids(ids))
    np.testing.assert_array_equal(reply.values, initial_rows(SPEC, ids).numpy())
    assert reply.versions.tolist() == [0, 0, 0, 0]
    stale = server.pull_stale("t", encode_ids(ids), np.full(4, -1).tobytes(), 0)
    assert stale.positions.tolist() == [0, 1, 2, 3] and stale.versions.tolist() == [0] * 4
    np.testing.assert_array_equal(stale.values, initial_rows(SPEC, ids).numpy())
    assert server.stats()[0].rows == 0  # reads never grow the table
    server.push("t", encode_ids(np.array([3])), _grads(1).tobytes(), "w")
    mixed = server.pull("t", encode_ids(ids))  # a written row beside unwritten ones
    assert mixed.versions.tolist() == [0, 1, 0, 0] and server.stats()[0].rows == 1
    np.testing.assert_array_equal(mixed.values[[0, 2, 3]], initial_rows(SPEC, ids[[0, 2, 3]]))
    unsized = server.stats(sizes=False)[0]  # what a client's topology check asks for
    assert (unsized.rows, unsized.bytes, unsized.counters.pull_requests) == (0, 0, 3)


def test_push_sums_duplicates_and_bumps_versions_once():
    server = _server()
    ids = np.array([5, 2, 5], dtype=np.int64)
    grads = _grads(3)
    assert server.push("t", encode_ids(ids), grads.tobytes(), "r1") == (False, 2)
    reply = server.pull("t", encode_ids(np.array([5, 2], dtype=np.int64)))
    start = initial_rows(SPEC, np.array([5, 2], dtype=np.int64)).numpy()
    expected = start - 0.5 * np.stack([grads[0] + grads[2], grads[1]])
    np.testing.assert_allclose(reply.values, expected, rtol=1e-6)
    assert reply.versions.tolist() == [1, 1]


@pytest.mark.parametrize("window", [1, 3, 8])
def test_the_dedup_window_holds_exactly_its_size_in_request_ids(window):
    server = _server(dedup_window=window)
    ids, grads = encode_ids(np.array([1], dtype=np.int64)), _grads(1).tobytes()
    for n in range(window):
        assert server.push("t", ids, grads, f"r{n}") == (False, 1)
    assert server.push("t", ids, grads, "r0") == (True, 0)  # the oldest, at the window's edge
    server.push("t", ids, grads, f"r{window}")  # one more pushes r0 out
    assert server.push("t", ids, grads, f"r{window}") == (True, 0)
    assert server.push("t", ids, grads, "r0") == (False, 1)
    assert server.pull("t", ids).versions.tolist() == [window + 2]


def test_sorted_duplicate_ids_are_summed_into_one_step_per_id():
    """Ids that arrive sorted but repeated must not take the strictly-increasing fast path."""
    server = _server()
    ids = np.array([2, 2, 4, 7, 7, 7], dtype=np.int64)
    server.push("t", encode_ids(np.array([4])), _grads(1, seed=1).tobytes(), "existing")
    grads = _grads(6, seed=2)
    assert server.push("t", encode_ids(ids), grads.tobytes(), "sorted") == (False, 3)
    distinct = np.array([2, 4, 7], dtype=np.int64)
    reply = server.pull("t", encode_ids(distinct))
    start = initial_rows(SPEC, distinct).numpy().astype(np.float64)
    start[1] -= 0.5 * _grads(1, seed=1)[0]
    summed = np.stack([grads[0:2].sum(0), grads[2], grads[3:6].sum(0)]).astype(np.float64)
    np.testing.assert_allclose(reply.values, start - 0.5 * summed, rtol=1e-6, atol=1e-7)
    assert reply.versions.tolist() == [1, 2, 1]


def test_repeated_request_id_is_applied_once_until_it_leaves_the_window():
    server = _server(dedup_window=2)
    ids, grads = encode_ids(np.array([1], dtype=np.int64)), _grads(1).tobytes()
    assert server.push("t", ids, grads, "a") == (False, 1)
    assert server.push("t", ids, grads, "a") == (True, 0)
    server.push("t", ids, grads, "b")
    server.push("t", ids, grads, "c")  # "a" falls out of a window of 2
    assert server.push("t", ids, grads, "a") == (False, 1)
    assert server.pull("t", ids).versions.tolist() == [4]
    assert server.stats()[0].counters.duplicate_pushes == 1


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_gradient_rejects_the_whole_request(bad):
    server = _server()
    ids = np.array([1, 2, 3], dtype=np.int64)
    before = server.pull("t", encode_ids(ids))
    grads = _grads(3)
    grads[2, 1] = bad
    with pytest.raises(InvalidArgumentError, match="NaN or Inf .* row 2, id 3"):
        server.push("t", encode_ids(ids), grads.tobytes(), "r")
    after = server.pull("t", encode_ids(ids))
    np.testing.assert_array_equal(after.values, before.values)
    assert after.versions.tolist() == [0, 0, 0]
    # The rejected request id was not recorded: a corrected retry applies.
    assert server.push("t", encode_ids(ids), _grads(3).tobytes(), "r") == (False, 3)


@pytest.mark.parametrize(
    "ids, grads, message",
    [
        (b"1234567", b"", "not a multiple of 8"),
        (
            encode_ids(np.array([1, 2])),
            bytes(4 * 4),
            "grads must hold 2 ids x dim 4 float32 = 32 bytes, got 16",
        ),
        (encode_ids(np.array([-3])), bytes(16), "ids must be >= 0"),
    ],
)
def test_malformed_push_is_invalid_argument(ids, grads, message):
    with pytest.raises(InvalidArgumentError, match=message):
        _server().push("t", ids, grads, "r")


def test_empty_push_and_pull_are_ok():
    server = _server()
    assert server.push("t", b"", b"", "r") == (False, 0)
    reply = server.pull("t", b"")
    assert reply.values.shape == (0, 4) and reply.versions.shape == (0,)


def test_push_needs_request_id():
    with pytest.raises(InvalidArgumentError, match="request_id"):
        _server().push("t", b"", b"", "")


def test_unknown_table_names_the_known_ones():
    with pytest.raises(TableNotFoundError, match="table 'nope' does not exist \\(tables: t\\)"):
        _server().pull("nope", b"")


def test_foreign_ids_are_refused_before_any_row_is_created():
    server = ParameterServer(shard=1, num_shards=4)
    server.create_table(SPEC)
    ids = np.arange(100, dtype=np.int64)
    mine = ids[shard_of("t", ids, 4) == 1]
    server.push("t", encode_ids(mine), _grads(len(mine)).tobytes(), "mine")
    with pytest.raises(NotOwnedError, match="belong to other shards"):
        server.pull("t", encode_ids(ids))
    with pytest.raises(NotOwnedError):
        server.push("t", encode_ids(ids), _grads(100).tobytes(), "r")
    assert server.stats()[0].rows == len(mine)


def test_reply_over_the_message_limit_is_refused():
    server = _server(max_message_bytes=1 << 16)
    with pytest.raises(MessageTooLargeError, match="split the ids"):
        server.pull("t", encode_ids(np.arange(4000)))
    assert server.stats()[0].rows == 0


def test_create_table_is_idempotent_and_refuses_a_different_spec():
    server = _server()
    assert server.create_table(SPEC) is False
    other = TableSpec("t", dim=8)
    with pytest.raises(TableExistsError, match="different spec"):
        server.create_table(other)
    assert server.list_tables() == [SPEC]


def test_pull_stale_checks_versions_and_reports_positions():
    server = _server()
    ids = np.array([4, 8, 4], dtype=np.int64)
    with pytest.raises(InvalidArgumentError, match="one int64 per id: 3 ids need 24 bytes, got 16"):
        server.pull_stale("t", encode_ids(ids), np.zeros(2, dtype=np.int64).tobytes(), 0)
    server.push("t", encode_ids(np.array([8])), _grads(1).tobytes(), "r")
    reply = server.pull_stale("t", encode_ids(ids), np.zeros(3, dtype=np.int64).tobytes(), 0)
    assert reply.positions.tolist() == [1] and reply.versions.tolist() == [1]
    np.testing.assert_array_equal(reply.values, server.pull("t", encode_ids(np.array([8]))).values)


def test_assign_overwrites_rows_and_state_all_or_nothing():
    server = ParameterServer(shard=0, num_shards=1)
    spec = TableSpec("a", dim=2, optimizer=OptimizerSpec(OptimizerKind.ADAGRAD, lr=0.1))
    server.create_table(spec)
    ids = encode_ids(np.array([3, 5]))
    values = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    state = np.full((2, 2), 4.0, dtype=np.float32)
    assert server.assign("a", ids, values.tobytes(), state.tobytes(), "w1") is False
    assert server.assign("a", ids, values.tobytes(), state.tobytes(), "w1") is True
    reply = server.pull("a", ids)
    np.testing.assert_array_equal(reply.values, values)
    assert reply.versions.tolist() == [1, 1]
    server.push("a", ids, np.ones((2, 2), dtype=np.float32).tobytes(), "p")
    # Adagrad with the assigned state 4: s = 5, step = 0.1 / sqrt(5)
    np.testing.assert_allclose(server.pull("a", ids).values, values - 0.1 / np.sqrt(5.0), rtol=1e-6)
    bad = values.copy()
    bad[1, 1] = np.inf
    with pytest.raises(InvalidArgumentError, match="values .* NaN or Inf"):
        server.assign("a", ids, bad.tobytes(), b"", "w2")
    with pytest.raises(InvalidArgumentError, match="distinct ids"):
        server.assign(
            "a", encode_ids(np.array([3, 3])), np.zeros(4, np.float32).tobytes(), b"", "w3"
        )
    assert server.pull("a", ids).versions.tolist() == [2, 2]


def test_assign_refuses_negative_and_foreign_ids_and_writes_nothing():
    server = ParameterServer(shard=0, num_shards=2)
    server.create_table(TableSpec("a", dim=2))
    ids = np.arange(50, dtype=np.int64)
    mine, foreign = ids[shard_of("a", ids, 2) == 0][:1], ids[shard_of("a", ids, 2) == 1][:1]
    values = np.ones((2, 2), dtype=np.float32).tobytes()
    with pytest.raises(InvalidArgumentError, match="ids must be >= 0; got -4 in table 'a'"):
        server.assign("a", encode_ids(np.array([*mine, -4])), values, b"", "w1")
    with pytest.raises(NotOwnedError, match=f"id {foreign[0]} belongs to shard 1"):
        server.assign("a", encode_ids(np.array([*mine, *foreign])), values, b"", "w2")
    assert server.pull("a", encode_ids(mine)).versions.tolist() == [0]


def test_a_pull_batch_is_refused_when_its_replies_together_pass_the_limit():
    server = _server(max_message_bytes=1 << 16)
    server.create_table(TableSpec("u", dim=4))
    ids = encode_ids(np.arange(1500, dtype=np.int64))  # 1500 x 24 B = 36 KB: one fits
    assert len(server.pull_batch([("t", ids, False)])[0].values) == 1500
    with pytest.raises(MessageTooLargeError, match="a batch of 2 reads .*3000 ids"):
        server.pull_batch([("t", ids, False), ("u", ids, False)])
    held = np.full(1500, -1, dtype=np.int64).tobytes()
    with pytest.raises(MessageTooLargeError, match="a batch of 2 reads"):
        server.pull_stale_batch([("t", ids, held, 0), ("u", ids, held, 0)])
    assert [s.counters.pull_requests for s in server.stats()] == [1, 0]  # nothing read
    at_limit = encode_ids(np.arange(2688, dtype=np.int64))  # 2688 x 24 B + 1024 = 64 KiB
    assert len(server.pull("t", at_limit).values) == 2688  # alone: as its own check allows
    with pytest.raises(MessageTooLargeError, match="read of 2689 ids"):
        server.pull("t", encode_ids(np.arange(2689, dtype=np.int64)))


def test_stats_do_not_wait_for_a_tables_lock():
    """Sizes of a Redis-backed table cost a key scan: under the table's lock, every pull
    and push would stall behind a monitor's Stats."""
    server = _server()
    (table,) = server.tables().values()
    answered = threading.Event()
    with table._lock:  # a long push in progress
        reader = threading.Thread(target=lambda: server.stats() and answered.set())
        reader.start()
        assert answered.wait(30), "stats waited for the table's lock"
    reader.join(30)


def test_checkpoints_are_written_only_under_the_checkpoint_root(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    (root / "finished").mkdir()
    (root / "finished" / "manifest.json").write_text("{}")
    unrooted = _server()
    unrooted.checkpoints.pause("c0", 10)
    with pytest.raises(PermissionDeniedError, match="without --checkpoint-root"):
        unrooted.checkpoints.write("c0", str(root / "x"), "")
    server = _server(checkpoint_root=str(root))
    for number, (directory, refusal) in enumerate(
        [
            (root / ".." / "outside" / "c", PermissionDeniedError),
            (root / "escape" / "c", PermissionDeniedError),
            ("/etc/ember-ckpt", PermissionDeniedError),
            ("relative/dir", InvalidArgumentError),
            (root, PermissionDeniedError),  # the root itself holds checkpoints, is none
            (root / "finished", PermissionDeniedError),  # never overwrite a finished one
            (str(root) + "/bad\0name", InvalidArgumentError),
        ]
    ):
        server.checkpoints.pause(f"c{number}", 10)
        with pytest.raises(refusal):
            server.checkpoints.write(f"c{number}", str(directory), "")  # and resumes writes
    assert list(outside.iterdir()) == []
    server.checkpoints.pause("ok", 10)
    files, _ = server.checkpoints.write("ok", str(root / "ckpt-000001"), "")
    assert {entry.path for entry in files} == {
        "shard-0-of-1.t.rows",
        "shard-0-of-1.meta.json",
    } and (root / "ckpt-000001").is_dir()


@pytest.mark.parametrize("lease", [0.0, -1.0, float("nan"), float("inf"), 300.5])
def test_a_pause_lease_outside_its_documented_range_is_refused(lease):
    from ember.ps_server.durability.shard_checkpoint import MAX_PAUSE_LEASE_S

    server = _server()
    with pytest.raises(InvalidArgumentError, match=f"in \\(0, {MAX_PAUSE_LEASE_S:g}\\] seconds"):
        server.checkpoints.pause("c", lease)
    server.push("t", encode_ids(np.array([1])), _grads(1).tobytes(), "not-held")
    server.checkpoints.pause("c", MAX_PAUSE_LEASE_S)  # the maximum itself is fine
    server.checkpoints.resume("c")


def test_a_checkpoint_cut_holds_a_push_that_arrives_during_the_pause(tmp_path):
    """Deterministic: the row files and the recorded request ids describe one moment, and a
    push held by the pause lands after it."""
    server = _server(checkpoint_root=str(tmp_path))
    ids = encode_ids(np.array([4, 8], dtype=np.int64))
    server.push("t", ids, _grads(2, seed=1).tobytes(), "before")
    server.checkpoints.pause("c1", 60)
    pushed = threading.Thread(
        target=server.push, args=("t", ids, _grads(2, seed=2).tobytes(), "during")
    )
    pushed.start()
    assert server.gate.await_held(1, timeout_s=30), "the push was not held by the pause"
    files, _ = server.checkpoints.write("c1", str(tmp_path / "c1"), "")
    pushed.join(30)
    assert not pushed.is_alive()
    (rows_file,) = [tmp_path / "c1" / f.path for f in files if f.table == "t"]
    ((file_ids, batch),) = list(read_row_file(rows_file, SPEC.dim, 0))
    assert sorted(file_ids.tolist()) == [4, 8] and batch.versions.tolist() == [1, 1]
    meta = json.loads((tmp_path / "c1" / "shard-0-of-1.meta.json").read_text())
    assert meta["applied_request_ids"] == {"t": ["before"]}
    after = server.pull("t", ids)
    assert after.versions.tolist() == [2, 2]  # the held push landed after the cut


def test_a_tripped_fault_refuses_every_data_request_but_stats(tmp_path):
    server = _server(checkpoint_root=str(tmp_path))
    ids = encode_ids(np.array([1], dtype=np.int64))
    server.fault.trip("the disk under the write-ahead log failed")
    refusals = [
        lambda: server.pull("t", ids),
        lambda: server.pull_stale("t", ids, np.zeros(1, np.int64).tobytes(), 0),
        lambda: server.push("t", ids, _grads(1).tobytes(), "r"),
        lambda: server.assign("t", ids, _grads(1).tobytes(), b"", "a"),
        lambda: server.create_table(TableSpec("new", dim=2)),
        lambda: server.checkpoints.pause("c", 10),
    ]
    for request in refusals:
        with pytest.raises(ShardFailedError, match="stopped serving: the disk under"):
            request()
    assert [t.name for t in server.stats()] == ["t"]


ADAM_SPEC = TableSpec("adam", dim=3, optimizer=OptimizerSpec(OptimizerKind.ADAM, lr=0.1))


def test_a_pull_with_state_returns_each_rows_optimizer_state_zero_where_unwritten():
    server = ParameterServer(0, 1)
    server.create_table(ADAM_SPEC)
    grads = [_grads(1, seed=s)[:, :3] for s in (1, 2)]
    for n, grad in enumerate(grads):
        server.push("adam", encode_ids(np.array([3])), np.ascontiguousarray(grad).tobytes(), f"{n}")
    reply = server.pull("adam", encode_ids(np.array([9, 3, 9])), with_state=True)
    row = ReferenceRow(initial_rows(ADAM_SPEC, np.array([3])).numpy()[0], ADAM_SPEC.optimizer)
    for grad in grads:
        row.apply(grad[0])
    assert reply.versions.tolist() == [0, 2, 0] and reply.state.shape == (3, 6)
    np.testing.assert_allclose(reply.state[1], np.concatenate([row.m, row.v]), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(reply.values[1], row.w, rtol=1e-5, atol=1e-6)
    assert not reply.state[[0, 2]].any()
    assert server.pull("adam", encode_ids(np.array([3]))).state.shape == (1, 0)  # not asked for


def test_assign_sets_versions_when_given_and_refuses_bad_ones():
    server = ParameterServer(0, 1)
    server.create_table(ADAM_SPEC)
    ids = encode_ids(np.array([1, 2]))
    values = np.ones((2, 3), np.float32).tobytes()
    state = np.full((2, 6), 0.5, np.float32).tobytes()
    server.assign("adam", ids, values, state, "a", np.array([7, 40], "<i8").tobytes())
    reply = server.pull("adam", ids, with_state=True)
    assert reply.versions.tolist() == [7, 40] and (reply.state == 0.5).all()
    server.assign("adam", ids, values, b"", "b")  # no versions: each grows by one
    assert server.pull("adam", ids).versions.tolist() == [8, 41]
    for bad, message in (
        (np.array([-1, 2], "<i8").tobytes(), "versions must be >= 0"),
        (np.array([3], "<i8").tobytes(), "one int64 per id"),
    ):
        with pytest.raises(InvalidArgumentError, match=message):
            server.assign("adam", ids, values, b"", "c", bad)
    assert server.pull("adam", ids).versions.tolist() == [8, 41]
