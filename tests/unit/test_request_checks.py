import numpy as np
import pytest
from ember.ps_server.errors import InvalidArgumentError, NotOwnedError, TableNotFoundError
from ember.ps_server.routing import shard_of
from ember.ps_server.shard.server import ParameterServer
from ember.ps_server.wire.messages import encode_ids
from ember.ps_server.wire.row_dtype import RowDtype
from ember.ps_server.wire.table_spec import TableSpec


def test_unknown_table_error_stays_short_however_many_tables_and_however_long_the_name():
    # gRPC fails a call whose error details pass its 8 KiB metadata limit with
    # RESOURCE_EXHAUSTED instead of the error's own code.
    server = ParameterServer(shard=0, num_shards=1)
    for n in range(200):
        server.create_table(TableSpec(f"{n:03d}" + "x" * 125, dim=1))
    with pytest.raises(TableNotFoundError) as info:
        server.pull("y" * 100_000, b"")
    message = str(info.value)
    assert len(message) < 2048 and message.endswith("and 190 more); create it first")


@pytest.mark.parametrize("first", [True, False], ids=["first-of-its-table", "last"])
def test_a_foreign_id_is_named_with_its_own_table_when_several_are_checked_together(first):
    server = ParameterServer(shard=0, num_shards=3)
    for name in ("a", "b", "c"):
        server.create_table(TableSpec(name, dim=2))
    ids = np.arange(200, dtype=np.int64)
    mine = {name: ids[shard_of(name, ids, 3) == 0] for name in "abc"}
    foreign = int(ids[shard_of("c", ids, 3) == 2][0])
    c_ids = [foreign, *mine["c"]] if first else [*mine["c"], foreign]
    entries = [("a", encode_ids(mine["a"])), ("b", b""), ("c", encode_ids(c_ids))]
    with pytest.raises(
        NotOwnedError,
        match=f"1 of {len(mine['c']) + 1} ids of table 'c' .*id {foreign} belongs to shard 2",
    ):
        server.checks.reads(entries)
    assert [len(ids) for _, ids in server.checks.reads(entries[:2])] == [len(mine["a"]), 0]


def test_a_negative_id_is_named_with_its_own_table_and_nothing_is_read():
    server = ParameterServer(shard=0, num_shards=1)
    for name in ("a", "b"):
        server.create_table(TableSpec(name, dim=2))
    entries = [("a", encode_ids([1, 2])), ("b", encode_ids([-7, 3, -100]))]
    with pytest.raises(InvalidArgumentError, match=r"ids must be >= 0; got -7 in table 'b'"):
        server.checks.reads(entries)
    grads = [("a", encode_ids([1, 2]), bytes(16), RowDtype.FLOAT32)]
    grads.append(("b", encode_ids([-7, 3, -100]), bytes(24), RowDtype.FLOAT32))
    with pytest.raises(InvalidArgumentError, match=r"ids must be >= 0; got -7 in table 'b'"):
        server.checks.writes(grads)


@pytest.mark.parametrize("check", ["reads", "writes"])
def test_an_unknown_table_is_refused_as_not_found_before_its_ids_are_looked_at(check):
    # Its ids would be refused too (negative), but a missing table is NOT_FOUND, and its
    # name, which may be any length, only ever appears cut short.
    server = ParameterServer(shard=0, num_shards=1)
    server.create_table(TableSpec("a", dim=2))
    entry = ("n" * 100_000, encode_ids([-1]))
    entries = [entry] if check == "reads" else [(*entry, bytes(8), RowDtype.FLOAT32)]
    with pytest.raises(TableNotFoundError) as info:
        getattr(server.checks, check)(entries)
    assert len(str(info.value)) < 2048


def test_checked_ids_are_writable_slices_of_one_copy_so_the_reads_copy_none():
    server = ParameterServer(shard=0, num_shards=1)
    for name in ("a", "b"):
        server.create_table(TableSpec(name, dim=2))
    packed = [encode_ids([5, 6]), encode_ids([7])]
    (_, a), (_, b) = server.checks.reads(list(zip("ab", packed)))
    assert a.tolist() == [5, 6] and b.tolist() == [7]
    assert a.flags.writeable and a.base is b.base is not None  # one joined copy
    assert not np.shares_memory(a, np.frombuffer(packed[0], dtype=np.int64))
    # One entry is copied too, out of a writable request buffer as UCX receives it: an
    # exact clock's update keeps its ids past the request's life.
    buffer = bytearray(encode_ids([8, 9]))
    ((_, only),) = server.checks.reads([("a", buffer)])
    assert only.tolist() == [8, 9]
    assert not np.shares_memory(only, np.frombuffer(buffer, dtype=np.int64))
