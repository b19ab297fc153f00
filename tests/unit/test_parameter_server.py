import numpy as np
import pytest
from ember.ps_server.errors import (
    InvalidArgumentError,
    MessageTooLargeError,
    NotOwnedError,
    TableExistsError,
    TableNotFoundError,
)
from ember.ps_server.initializers import initial_rows
from ember.ps_server.routing import shard_of
from ember.ps_server.server import ParameterServer
from ember.ps_server.table_spec import OptimizerKind, OptimizerSpec, TableSpec
from ember.ps_server.wire import encode_ids

SPEC = TableSpec("t", dim=4, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=0.5))


def _server(**kwargs) -> ParameterServer:
    server = ParameterServer(shard=0, num_shards=1, **kwargs)
    server.create_table(SPEC)
    return server


def _grads(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, SPEC.dim)).astype(np.float32)


def test_pull_creates_initial_rows_in_request_order_with_duplicates():
    server = _server()
    ids = np.array([9, 3, 9, 0], dtype=np.int64)
    reply = server.pull("t", encode_ids(ids))
    np.testing.assert_array_equal(reply.values, initial_rows(SPEC, ids).numpy())
    assert reply.versions.tolist() == [0, 0, 0, 0]
    assert server.stats()[0].rows == 3
    unsized = server.stats(sizes=False)[0]  # what a client's topology check asks for
    assert (unsized.rows, unsized.bytes, unsized.counters.pull_requests) == (0, 0, 1)


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
    server.pull("t", encode_ids(mine))
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
