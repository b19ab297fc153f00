"""The rows and optimizer state a shard writes into its step replies, in process: each
table's rows in its own dtype, joined back to back, gathered straight into the reply at
whatever alignment it has, and the state read alike or into a tensor of its shape."""

import numpy as np
import pytest
import torch
from ember.ps_server.errors import OutOfRangeError
from ember.ps_server.shard import step_rows
from ember.ps_server.shard.initializers import initial_rows
from ember.ps_server.shard.step_handlers import StepHandlers
from ember.ps_server.shard.step_rows import (
    state_bytes,
    write_joined_rows,
    write_optimizer_state,
)
from ember.ps_server.wire.proto_wire import aligned_len_field
from ember.ps_server.wire.row_dtype import RowDtype
from ember.ps_server.wire.step_codec import (
    decode_lookup_request,
    decode_lookup_response,
    decode_update_request,
    encode_lookup_request,
    encode_update_request,
)
from ember.ps_server.wire.table_spec import TableSpec

from tests.support.steps_in_process import (
    ADAM,
    OTHER,
    clock,
    shard,
    update,
)  # fmt: skip


def test_a_lookup_of_tables_with_other_dims_and_dtypes_answers_each_in_its_own():
    # Odd-sized float16 entries shift the entries after them: rows land where the reply says.
    server = shard()
    ids = np.arange(1500, dtype=np.int64)
    request = encode_lookup_request(
        [("other", ids[:701], RowDtype.FLOAT16), ("emb", ids, RowDtype.FLOAT32),
         ("big", ids[:3], RowDtype.BFLOAT16)],
        None,
    )  # fmt: skip
    server.create_table(TableSpec("big", dim=5))
    reply = decode_lookup_response(StepHandlers(server).lookup(decode_lookup_request(request)))
    expected = [
        (np.float16, 701, initial_rows(OTHER, ids[:701]).half()),
        (np.float32, 1500, initial_rows(ADAM, ids)),
        (None, 3, initial_rows(TableSpec("big", dim=5), ids[:3]).bfloat16()),
    ]
    for values, (dtype, count, rows) in zip(reply.values, expected, strict=True):
        if dtype is None:  # bfloat16: the upper halves of float32 bit patterns
            got = torch.from_numpy(np.frombuffer(values, "<i2").copy()).view(torch.bfloat16)
        else:
            got = torch.from_numpy(np.frombuffer(values, dtype).copy())
        assert torch.equal(got.view(count, -1), rows)


def test_rows_that_cannot_start_aligned_are_gathered_into_the_reply():
    # Over 2 MiB a length varint has room for one byte of padding: this entry starts
    # unaligned, and its rows are gathered into it all the same.
    server = shard()
    ids = np.arange(180_000, dtype=np.int64)
    assert len(aligned_len_field(1, len(ids) * 3 * 4, 0)) % 4
    request = encode_lookup_request([("emb", ids)], None)
    reply = decode_lookup_response(StepHandlers(server).lookup(decode_lookup_request(request)))
    rows = np.frombuffer(reply.values[0], "<f4").reshape(len(ids), 3)
    assert np.array_equal(rows, initial_rows(ADAM, ids).numpy())


def _values_and_joined(server, entries):
    """The rows of one lookup answered per table and joined."""
    handlers, replies = StepHandlers(server), []
    for joined in (False, True):
        request = encode_lookup_request(entries, None, joined_rows=joined)
        replies.append(decode_lookup_response(handlers.lookup(decode_lookup_request(request))))
    return replies


@pytest.mark.parametrize("rows", [1500, 180_000])  # a length varint of 3 bytes, and of 4
def test_a_joined_lookup_answers_every_tables_rows_back_to_back(rows):
    server = shard()
    server.create_table(TableSpec("big", dim=5))
    server.create_table(TableSpec("empty", dim=3))
    ids = np.arange(rows, dtype=np.int64)[::-1].copy()
    written = np.arange(0, rows, 7)  # stored rows, gathered; the others are initial rows
    update(server, 0, written, np.ones((len(written), 3)), world=1)
    for entries in (
        [("emb", ids[:700]), ("other", ids[:3]), ("empty", ids[:0]), ("big", ids)],  # float32
        [
            ("other", ids[:701], RowDtype.FLOAT16),
            ("emb", ids, RowDtype.FLOAT32),
            ("empty", ids[:0], RowDtype.FLOAT16),
            ("big", ids[:3], RowDtype.BFLOAT16),
        ],
    ):  # fmt: skip  (an odd-sized float16 entry shifts the entries after it)
        per_table, joined = _values_and_joined(server, entries)
        assert not joined.values and per_table.rows == b""
        assert len(per_table.values) == len(entries)
        assert bytes(joined.rows) == b"".join(bytes(v) for v in per_table.values)
    assert len(joined.rows) == 701 * 2 * 2 + rows * 3 * 4 + 3 * 5 * 2  # float16, 32, bfloat16


def test_a_run_of_packed_tables_is_packed_at_once_and_a_row_beyond_names_its_table(
    monkeypatch,
):
    """Consecutive entries of one packed dtype (an empty one among them) are read and packed
    in one call, never entry by entry: the same bytes as each alone; a row beyond float16
    in the run's second table is refused naming that table and id, as its own packing
    would, from the one read (each table counted once)."""
    server = shard()
    for name, dim in (("big", 5), ("empty", 3), ("last", 4)):
        server.create_table(TableSpec(name, dim=dim))
    ids = np.arange(40, dtype=np.int64)
    update(server, 0, ids[::3].copy(), np.ones((14, 3)), world=1)
    f16, bf16 = RowDtype.FLOAT16, RowDtype.BFLOAT16
    entries = [("emb", ids, f16), ("empty", ids[:0], f16), ("other", ids[:9], f16),
               ("big", ids[:5], bf16), ("last", ids[:3], bf16)]  # fmt: skip
    per_table, _ = _values_and_joined(server, entries)

    def one_entry_at_a_time(*args):
        raise AssertionError("a run's rows were packed entry by entry")

    request = encode_lookup_request(entries, None, joined_rows=True)
    with monkeypatch.context() as patch:
        patch.setattr(step_rows, "rows_to_wire", one_entry_at_a_time)
        joined = decode_lookup_response(StepHandlers(server).lookup(decode_lookup_request(request)))
    assert bytes(joined.rows) == b"".join(bytes(v) for v in per_table.values)
    beyond = encode_update_request(
        [("other", ids[4:5], np.full((1, 2), -3e5, "<f4"))], clock(1, world=1)
    )  # SGD lr 0.5: the row of id 4 near 1.5e5 > 65504
    server.steps.update(decode_update_request(beyond))
    before = {name: server.tables()[name].counters.pull_requests for name in ("emb", "other")}
    with pytest.raises(
        OutOfRangeError, match="table 'other': the row of id 4 holds 150000, beyond"
    ):
        StepHandlers(server).lookup(decode_lookup_request(request))
    for name, count in before.items():
        assert server.tables()[name].counters.pull_requests == count + 1


def test_a_joined_lookup_of_no_rows_has_an_empty_payload():
    _, joined = _values_and_joined(shard(), [("emb", np.empty(0, np.int64))])
    assert joined.rows == b"" and not joined.values


def test_joined_float32_rows_are_gathered_into_a_payload_that_is_not_aligned():
    server = shard()
    ids = np.arange(0, 3000, 3, dtype=np.int64)
    written = ids[::2].copy()  # stored rows; the others read as initial rows
    update(server, 0, written, np.ones((len(written), 3)), world=1)
    request = encode_lookup_request([("emb", ids), ("other", ids[:5])], None)
    reads, _ = server.steps.lookup(decode_lookup_request(request))
    buffer = bytearray(len(ids) * 3 * 4 + 5 * 2 * 4 + 1)
    write_joined_rows(reads, memoryview(buffer)[1:])  # one byte past an aligned start
    expected = np.concatenate([table.read_weights(i).numpy().ravel() for table, i, _ in reads])
    assert np.array_equal(np.frombuffer(bytes(buffer[1:]), "<f4"), expected)
    assert not np.array_equal(expected[:3], initial_rows(ADAM, ids[:1]).numpy().ravel())


@pytest.mark.parametrize("skew", [0, 1, 2, 3])  # the state starts at every alignment
def test_optimizer_state_is_written_alike_into_aligned_and_unaligned_payloads(skew):
    server = shard()
    written = np.arange(1, 40, 2, dtype=np.int64)
    update(server, 0, written, np.ones((len(written), 3)), world=1)
    update(server, 1, written[::3].copy(), np.ones((7, 3)), world=1)
    ids = np.array([7, 2, 39, 7, 1], np.int64)  # 2 was never written; 7 twice; odd counts
    request = encode_update_request(
        [("emb", written[:1], np.zeros((1, 3), "<f4"))], clock(2, world=1),
        read_state=[("emb", ids), ("other", ids[:3])],
    )  # fmt: skip
    states = server.steps.update(decode_update_request(request)).states
    size = state_bytes(states)
    buffer = bytearray(b"\xff" * (size + 4 + skew))  # NaN words: an unwritten row shows
    start = -np.frombuffer(buffer, np.uint8).ctypes.data % 4 + skew
    write_optimizer_state(states, memoryview(buffer)[start : start + size])
    expected = []
    for table, table_ids, _ in states:
        stored = server.pull(table.spec.name, table_ids.tobytes(), with_state=True)
        expected += [stored.versions.tobytes(), stored.state.tobytes()]
    assert bytes(buffer[start : start + size]) == b"".join(expected)
    assert size == 8 * 8 + 4 * 5 * 6  # Adam: 6 state words a row, SGD none


@pytest.mark.parametrize(
    "state",
    [torch.empty(2, 6, dtype=torch.float64), torch.empty(1, 6), torch.empty(2, 1),
     torch.empty(6, 2).t()],
)  # fmt: skip
def test_a_state_read_into_a_tensor_of_another_shape_or_type_is_refused(state):
    server = shard()  # Adam over dim 3: six state words a row; a copy would broadcast a [2, 1]
    with pytest.raises(ValueError, match="state must be"):
        server.tables()["emb"].read_state(np.array([1, 2], np.int64), state)
