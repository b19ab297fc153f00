"""A step lookup's joined answers land where each table's ids ask, whatever the widths and
dtypes; an answer of the wrong size is refused before anything is placed."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from ember.ps_server.client import joined_lookup
from ember.ps_server.client.joined_ids import JoinedIds
from ember.ps_server.client.joined_lookup import JoinedLookup
from ember.ps_server.client.step_client import StepClient
from ember.ps_server.errors import InvalidArgumentError, PSClientError, Status
from ember.ps_server.routing import shard_of
from ember.ps_server.wire.row_dtype import RowDtype
from ember.ps_server.wire.row_packing import TORCH_DTYPES, rows_to_wire
from ember.ps_server.wire.step_codec import LookupResponseView

# Widths out of order (3, 8, 3, 5, 8), every dtype, duplicates and a table without ids.
TABLES = ["a", "b", "c", "d", "e"]
DIMS = [3, 8, 3, 5, 8]
DTYPES = [RowDtype.FLOAT32, RowDtype.BFLOAT16, RowDtype.FLOAT16, RowDtype.FLOAT32, RowDtype.FLOAT32]


def _row(table: str, ids: np.ndarray, dim: int) -> torch.Tensor:
    """The rows a shard holds: a distinct value per table, id and column."""
    salt = TABLES.index(table) * 1000.0
    return torch.from_numpy(ids[:, None] * 0.25 + salt + np.arange(dim)[None, :]).float()


def _answer(lookup: JoinedLookup, shard: int) -> bytes:
    """What a shard answers for :meth:`JoinedLookup.entries`: rows back to back."""
    parts = []
    for table, ids, dtype in lookup.ids.entries(shard):
        rows = _row(table, ids, DIMS[TABLES.index(table)])
        parts.append(rows_to_wire(rows, dtype, table, ids).tobytes())
    return b"".join(parts)


def _arrays(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = [40, 25, 7, 60, 0]  # an odd-sized float16 table shifts the next width
    return [rng.integers(0, 50, size).astype(np.int64) for size in sizes]


@pytest.mark.parametrize("num_shards", [1, 3])
def test_every_tables_rows_land_in_the_callers_order(num_shards):
    arrays = _arrays(3)
    lookup = JoinedLookup(JoinedIds(TABLES, arrays, DIMS, DTYPES, num_shards))
    for shard in range(num_shards):
        for table, ids, _ in lookup.ids.entries(shard):
            t = TABLES.index(table)
            assert (shard_of(table, ids, num_shards) == shard).all()
            assert set(ids.tolist()) <= set(arrays[t].tolist())
        lookup.place(shard, memoryview(_answer(lookup, shard)))
    rows = lookup.rows()
    assert list(rows) == TABLES
    for table, ids, dim, dtype in zip(TABLES, arrays, DIMS, DTYPES):
        expected = _row(table, ids, dim).to(TORCH_DTYPES.get(dtype, torch.float32)).float()
        assert rows[table].shape == (len(ids), dim)
        assert torch.equal(rows[table], expected), table


F16, BF16, F32 = RowDtype.FLOAT16, RowDtype.BFLOAT16, RowDtype.FLOAT32


@pytest.mark.parametrize(
    "dtypes, unpacks",  # table "a" (dim 2) comes first; table "e" has no ids
    [([F32, BF16, BF16, BF16, F32], 1), ([F32, F16, F16, F16, BF16], 1),
     ([F32, F16, BF16, F16, BF16], 4)],  # mixed packed dtypes: each table alone
)  # fmt: skip
def test_tables_of_one_width_and_packed_dtype_are_unpacked_at_once_each_at_its_rows(
    dtypes, unpacks, monkeypatch
):
    tables, dims = TABLES, [2, 4, 4, 4, 4]
    arrays = [np.array(a, np.int64) for a in ([3, 6, 1], [5, 1, 5, 9], [2, 3], [7, 7, 0, 4], [])]
    calls = []
    unpack = joined_lookup.rows_from_wire
    monkeypatch.setattr(
        joined_lookup, "rows_from_wire", lambda *a: calls.append(a[1]) or unpack(*a)
    )
    lookup = JoinedLookup(JoinedIds(tables, arrays, dims, dtypes, 1))
    answer = b"".join(
        rows_to_wire(_row(table, ids, dims[tables.index(table)]), dtype, table, ids).tobytes()
        for table, ids, dtype in lookup.ids.entries(0)
    )
    lookup.place(0, memoryview(answer))
    for table, ids, dim, dtype in zip(tables, arrays, dims, dtypes):
        expected = _row(table, ids, dim).to(TORCH_DTYPES.get(dtype, torch.float32)).float()
        assert torch.equal(lookup.rows()[table], expected), table
    assert len(calls) == unpacks  # float32 rows are read in place; a packed block at once


def test_an_answer_of_the_wrong_size_is_refused_and_places_nothing():
    lookup = JoinedLookup(JoinedIds(TABLES, _arrays(4), DIMS, DTYPES, 2))
    for shard in range(2):
        lookup.place(shard, memoryview(_answer(lookup, shard)))
    before = {table: rows.clone() for table, rows in lookup.rows().items()}
    answer = _answer(lookup, 0)
    for wrong in (answer[:-4], answer + bytes(4), b""):
        garbage = memoryview(bytes(len(wrong)))  # zeros: would show if placed
        with pytest.raises(InvalidArgumentError, match=f"{len(answer)} bytes of rows"):
            lookup.place(0, garbage)
    assert all(torch.equal(lookup.rows()[t], rows) for t, rows in before.items())


def test_a_lookup_of_no_tables_has_no_entries_and_no_rows():
    lookup = JoinedLookup(JoinedIds([], [], [], [], 2))
    assert lookup.ids.entries(0) == [] and lookup.ids.entries(1) == [] and lookup.rows() == {}
    lookup.place(0, memoryview(b""))


class _OneShard:
    """Stands in for a PSClient of one shard whose every call gets ``reply``."""

    endpoints, num_shards = ["shard-0:7000"], 1

    def __init__(self, reply: LookupResponseView) -> None:
        self.shard_rpc = SimpleNamespace(data_plane=SimpleNamespace(trailer=b""), run=self._run)
        self.reply = reply

    def _run(self, calls, on_reply):
        for index in range(len(calls)):
            on_reply(index, self.reply)

    def dim(self, table: str) -> int:
        return 4

    def ensure_topology(self) -> None:
        pass


@pytest.mark.parametrize(
    "reply, message",
    [
        (LookupResponseView([], -1, rows=memoryview(bytes(44))), "48 bytes of rows"),
        (LookupResponseView([memoryview(bytes(44))], -1), r"3 ids x dim 4 float32 = 48 bytes"),
        (LookupResponseView([memoryview(bytes(48))] * 2, -1), "1 tables' rows, got 2"),
    ],
)
def test_a_step_client_refuses_an_answer_it_did_not_ask_for_as_internal(reply, message):
    steps = StepClient(_OneShard(reply))
    with pytest.raises(PSClientError, match=message) as error:
        steps.lookup({"t": torch.tensor([1, 2, 1])})
    assert error.value.code == Status.INTERNAL and error.value.endpoint == "shard-0:7000"


def test_a_shard_that_predates_joined_rows_is_read_from_its_per_table_values():
    arrays = _arrays(8)
    lookup = JoinedLookup(JoinedIds(TABLES, arrays, DIMS, DTYPES, 2))
    for shard in range(2):
        values = [
            memoryview(rows_to_wire(_row(t, ids, DIMS[TABLES.index(t)]), dtype, t, ids).tobytes())
            for t, ids, dtype in lookup.ids.entries(shard)
        ]
        lookup.place_values(shard, values)
    for table, ids, dim, dtype in zip(TABLES, arrays, DIMS, DTYPES):
        expected = _row(table, ids, dim).to(TORCH_DTYPES[dtype]).float()
        assert torch.equal(lookup.rows()[table], expected), table
    steps = StepClient(_OneShard(LookupResponseView([memoryview(bytes(48))], -1)))
    assert torch.equal(steps.lookup({"t": torch.tensor([1, 2, 1])})[0]["t"], torch.zeros(3, 4))


def test_float32_tables_lead_their_width_so_their_rows_stay_aligned():
    ids = JoinedIds(
        ["h", "f", "w"], [np.arange(3)] * 3, [3, 3, 2],
        [RowDtype.FLOAT16, RowDtype.FLOAT32, RowDtype.BFLOAT16], 1,
    )  # fmt: skip
    assert ids.tables == ["w", "f", "h"] and ids.order == ["h", "f", "w"]
    with pytest.raises(ValueError, match="one entry per table"):
        JoinedIds(["a", "b"], [np.arange(3)], [3, 3], [RowDtype.FLOAT32] * 2, 1)
