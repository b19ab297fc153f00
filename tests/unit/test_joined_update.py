"""A step update's joined gradients reach each shard as every table's distinct ids with
their summed rows, whatever the widths and dtypes; bad gradients are refused naming the
table, before anything is packed."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from ember.ps_server.client import joined_update
from ember.ps_server.client.joined_update import JoinedUpdate
from ember.ps_server.client.step_client import StepClient
from ember.ps_server.client.step_job import StepJob
from ember.ps_server.errors import OutOfRangeError, PSClientError, Status
from ember.ps_server.routing import shard_of
from ember.ps_server.wire.row_dtype import RowDtype
from ember.ps_server.wire.row_packing import TORCH_DTYPES, rows_from_wire
from ember.ps_server.wire.step_codec import UpdateResponseView, decode_update_request

TABLES = ["a", "b", "c", "d"]
DIMS = [3, 8, 3, 5]  # widths out of order
DTYPES = [RowDtype.FLOAT32, RowDtype.BFLOAT16, RowDtype.FLOAT16, RowDtype.FLOAT32]


def _batch(seed: int):
    rng = np.random.default_rng(seed)
    arrays = [rng.integers(0, 30, size).astype(np.int64) for size in (40, 25, 7, 60)]
    grads = [torch.from_numpy(rng.standard_normal((len(a), d))) for a, d in zip(arrays, DIMS)]
    return arrays, grads  # float64 gradients: converted to float32 on the way


@pytest.mark.parametrize("num_shards", [1, 3])
def test_each_shard_gets_its_distinct_ids_with_their_summed_rows(num_shards):
    arrays, grads = _batch(5)
    update = JoinedUpdate(TABLES, arrays, grads, DIMS, DTYPES, num_shards)
    got = {table: {} for table in TABLES}
    for shard in range(num_shards):
        for table, ids, wire, dtype in update.grad_entries(shard):
            t = TABLES.index(table)
            assert dtype is DTYPES[t] and (shard_of(table, ids, num_shards) == shard).all()
            assert (np.diff(ids) > 0).all()  # distinct, ascending
            rows = rows_from_wire(wire.tobytes(), dtype, len(ids), DIMS[t], table)
            got[table].update({int(i): row for i, row in zip(ids, rows)})
    for table, ids, rows, dtype in zip(TABLES, arrays, grads, DTYPES):
        expected = {}
        for i, row in zip(ids.tolist(), rows.float()):  # summed in float32, in order
            expected[i] = expected.get(i, torch.zeros_like(row)) + row
        assert sorted(got[table]) == sorted(expected), table
        for i, row in expected.items():
            wire = row.to(TORCH_DTYPES[dtype]).float().numpy()
            np.testing.assert_array_equal(got[table][i], wire, err_msg=f"{table} id {i}")


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_gradient_that_is_not_finite_is_refused_naming_its_table(bad):
    arrays, grads = _batch(6)
    grads[2][5, 2] = bad  # "c" shares its width with "a"
    with pytest.raises(ValueError, match="grads of table 'c' contain NaN or Inf"):
        JoinedUpdate(TABLES, arrays, grads, DIMS, DTYPES, 2)


def test_finite_duplicates_whose_sum_overflows_are_refused():
    arrays = [np.array([4, 4], np.int64)]
    with pytest.raises(ValueError, match="grads of table 'a' contain NaN or Inf"):
        JoinedUpdate(["a"], arrays, [torch.full((2, 3), 3e38)], [3], [RowDtype.FLOAT32], 2)


def test_gradients_of_the_wrong_shape_are_refused():
    arrays, grads = _batch(7)
    grads[1] = grads[1][:, :7]
    with pytest.raises(ValueError, match=r"table 'b': grads must have shape \(25, 8\), got"):
        JoinedUpdate(TABLES, arrays, grads, DIMS, DTYPES, 2)


def test_a_gradient_beyond_its_wire_dtype_is_refused_when_packed():
    update = JoinedUpdate(
        ["a"], [np.array([9], np.int64)], [torch.full((1, 3), 1e5)], [3], [RowDtype.FLOAT16], 1
    )
    with pytest.raises(OutOfRangeError, match="gradients of table 'a': the row of id 9"):
        update.grad_entries(0)


F16, BF16, F32 = RowDtype.FLOAT16, RowDtype.BFLOAT16, RowDtype.FLOAT32


@pytest.mark.parametrize(
    "dtypes, packs",  # table "o" (dim 2) comes first: the dim-4 block starts past it
    [([F32, BF16, BF16, BF16, BF16], 1), ([F32, F16, F16, F16, F16], 1),
     ([F32, F16, BF16, F16, BF16], 3)],  # mixed packed dtypes: each table alone
)  # fmt: skip
def test_tables_of_one_width_and_packed_dtype_are_packed_at_once_each_at_its_rows(
    dtypes, packs, monkeypatch
):
    tables, dims = list("opqrs"), [2, 4, 4, 4, 4]
    rng = np.random.default_rng(8)
    arrays = [rng.integers(0, 30, n).astype(np.int64) for n in (11, 17, 0, 23, 9)]
    grads = [torch.from_numpy(rng.standard_normal((len(a), d)).astype(np.float32))
             for a, d in zip(arrays, dims)]  # fmt: skip
    calls = []
    pack = joined_update.rows_to_wire
    monkeypatch.setattr(joined_update, "rows_to_wire", lambda *a: calls.append(a[1]) or pack(*a))
    update = JoinedUpdate(tables, arrays, grads, dims, dtypes, 1)
    for table, ids, wire, dtype in update.grad_entries(0):
        t = tables.index(table)
        summed = {}
        for i, row in zip(arrays[t].tolist(), grads[t]):
            summed[i] = summed.get(i, torch.zeros(dims[t])) + row
        expected = torch.stack([summed[i] for i in ids.tolist()]).to(TORCH_DTYPES[dtype])
        assert dtype is dtypes[t] and wire.shape == (len(ids), dims[t])
        assert (
            wire.tobytes() == expected.numpy().tobytes()
            if dtype is F32
            else np.array_equal(wire.view(np.int16), expected.view(torch.int16).numpy())
        ), table
    assert len([d for d in calls if d is not F32]) == packs  # one call for the whole block


@pytest.mark.parametrize("dtype", [BF16, F16])
def test_a_gradient_that_cannot_travel_in_a_packed_block_names_its_table(dtype, monkeypatch):
    rng = np.random.default_rng(9)
    arrays = [rng.integers(0, 30, n).astype(np.int64) for n in (17, 23, 9)]
    grads = [torch.from_numpy(rng.standard_normal((len(a), 4)).astype(np.float32)) for a in arrays]
    grads[1][3, 1] = 1e5 if dtype is F16 else 3.4e38  # beyond the packed type
    update = JoinedUpdate(list("pqr"), arrays, grads, [4] * 3, [dtype] * 3, 1)
    with pytest.raises(
        OutOfRangeError, match=f"gradients of table 'q': the row of id {arrays[1][3]}"
    ):
        update.grad_entries(0)


class _TwoShards:
    """Stands in for a PSClient of two shards that answer every update's refresh with
    every other row asked for (its value a function of table and id)."""

    num_shards = 2

    def __init__(self, drop: int = 0, rows: bytes = b"", state: bytes = b"") -> None:
        self.drop = drop  # refreshed entries each answer leaves out
        self.flush = ""  # the checkpoint each answer says is waiting for a write-back
        self.rows, self.state = rows, state  # what each answer holds as read rows and state
        self.endpoints = ["shard-0:7000", "shard-1:7000"]
        self.dims = {"wide": 8, "narrow": 4, "wide2": 8}
        self.shard_rpc = SimpleNamespace(data_plane=SimpleNamespace(trailer=b""), run=self._run)

    def _run(self, calls, on_reply):
        for index, call in reversed(list(enumerate(calls))):  # the last shard answers first
            request = decode_update_request(call.request)
            refreshed = []
            for entry in request.refresh:
                ids = np.frombuffer(entry.ids, "<i8")
                found = np.arange(0, len(ids), 2, dtype=np.int64)
                rows = _refreshed(entry.table, ids[found], self.dims[entry.table])
                refreshed.append((memoryview(found.tobytes()), memoryview(rows.tobytes()), 0))
            answer = UpdateResponseView(False, refreshed[self.drop :], 0, self.flush)
            answer.rows, answer.state = memoryview(self.rows), memoryview(self.state)
            on_reply(index, answer)

    def dim(self, table: str) -> int:
        return self.dims[table]

    def ensure_topology(self) -> None:
        pass


def _refreshed(table: str, ids: np.ndarray, dim: int) -> np.ndarray:
    return (ids[:, None] * 10.0 + len(table) + np.arange(dim)[None, :]).astype("<f4")


def test_refreshed_rows_come_back_at_their_tables_own_positions():
    # Widths 8, 4, 8: the shards see the narrow table first; positions must map back.
    client = _TwoShards()
    refresh = {t: torch.arange(100, 100 + 7 * n, 7) for n, t in zip((30, 20, 25), client.dims)}
    result, _ = StepClient(client, StepJob("job")).update({}, 0, refresh)
    assert list(result) == list(refresh)
    for table, ids in refresh.items():
        positions, rows = result[table]
        order = torch.argsort(positions)  # in the order the shards answered
        owners = shard_of(table, ids.numpy(), 2)
        expected = np.sort(
            np.concatenate([np.flatnonzero(owners == k)[::2] for k in range(2)])
        )  # every other of each shard's ids
        assert positions[order].tolist() == expected.tolist(), table
        wanted = _refreshed(table, ids.numpy()[expected], client.dims[table])
        assert np.array_equal(rows[order].numpy(), wanted), table


def test_an_answer_that_refreshes_other_tables_than_asked_is_internal():
    steps = StepClient(_TwoShards(drop=1), StepJob("job"))
    with pytest.raises(PSClientError, match="must refresh 3 tables, got 2") as error:
        steps.update({}, 0, {t: torch.arange(0, 60, 2) for t in ("wide", "narrow", "wide2")})
    assert error.value.code == Status.INTERNAL


@pytest.mark.parametrize(
    ("rows", "read", "message"),
    [
        (b"", True, "a shard older than reads answers none"),  # it ignored the read
        (bytes(12), True, "its clock applied"),  # too few bytes
        (bytes(32), False, "32 bytes of rows nobody asked for"),
    ],
)
def test_an_answer_whose_read_rows_are_not_as_asked_is_internal(rows, read, message):
    steps = StepClient(_TwoShards(rows=rows), StepJob("job"))
    asked = {"wide": torch.arange(0, 60, 2)} if read else None
    with pytest.raises(PSClientError, match=message) as error:
        steps.update_and_read({}, 0, read=asked)
    assert error.value.code == Status.INTERNAL


def test_an_answer_without_the_state_asked_for_is_no_state_and_a_wrong_one_is_internal():
    asked = {"wide": torch.arange(0, 60, 2)}
    client = _TwoShards()  # shards that predate read_state: they answer none
    client.spec = lambda table: SimpleNamespace(optimizer=SimpleNamespace(kind=2))  # Adagrad
    answer = StepClient(client, StepJob("job")).update_and_read({}, 0, read_state=asked)
    assert answer.states == {}  # the caller falls back to a refresh
    client.state = bytes(40)  # neither none nor as many bytes as asked
    with pytest.raises(PSClientError, match="an update's read_state, its clock applied") as error:
        StepClient(client, StepJob("job")).update_and_read({}, 0, read_state=asked)
    assert error.value.code == Status.INTERNAL


def test_a_checkpoints_flush_request_is_the_newest_clocks_whatever_order_answers_come_in():
    client = _TwoShards()
    steps = StepClient(client, StepJob("job", replica=True))
    client.flush = "ckpt-7"
    steps.update({}, 1)
    assert steps.flush_request == "ckpt-7"
    client.flush = ""  # clock 0's answer, later than clock 1's (another thread's update)
    steps.update({}, 0)
    assert steps.flush_request == "ckpt-7"
    steps.update({}, 2)  # written back: the shards stop asking
    assert steps.flush_request == ""
    run, client.flush = client.shard_rpc.run, "ckpt-8"

    def fails(calls, on_reply):
        raise PSClientError("shard-0:7000", Status.UNAVAILABLE, "gone")

    client.shard_rpc.run = fails
    with pytest.raises(PSClientError):
        steps.update({}, 3)  # no answer: it does not count as the newest
    client.shard_rpc.run = run
    steps.update({}, 2)  # a retry of the newest answered clock answers for it again
    assert steps.flush_request == "ckpt-8"
