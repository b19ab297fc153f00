"""Rows and gradients as float16 / bfloat16 on the wire, against real shards on every transport:
exact packing both ways, float32 kept on the shard, the bytes saved, and what is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.client.shard_rpc import ShardCall
from ember.ps_server.client.step_client import StepClient
from ember.ps_server.client.step_job import StepJob
from ember.ps_server.errors import OutOfRangeError, PSClientError, Status
from ember.ps_server.routing import shard_of
from ember.ps_server.wire.messages import encode_ids
from ember.ps_server.wire.row_dtype import RowDtype
from ember.ps_server.wire.row_packing import TORCH_DTYPES
from ember.ps_server.wire.step_codec import encode_lookup_request, encode_update_request
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec

DIM = 8
LR = 0.5
DTYPES = {"half": RowDtype.FLOAT16, "brain": RowDtype.BFLOAT16, "full": RowDtype.FLOAT32}


def _tables(prefix: str) -> dict[str, TableSpec]:
    sgd = OptimizerSpec(OptimizerKind.SGD, lr=LR)
    return {
        f"{prefix}.{kind}": TableSpec(f"{prefix}.{kind}", DIM, optimizer=sgd) for kind in DTYPES
    }


def _wire_dtypes(prefix: str) -> dict[str, RowDtype]:
    return {f"{prefix}.{kind}": dtype for kind, dtype in DTYPES.items()}


def test_rows_and_gradients_travel_packed_while_the_shard_keeps_float32(
    cluster, table_name, transport
):
    tables, ids = _tables(table_name), torch.arange(0, 600, 3)
    wire = _wire_dtypes(table_name)
    grads = {name: torch.randn(len(ids), DIM, generator=torch.Generator().manual_seed(n))
             for n, name in enumerate(tables)}  # fmt: skip
    with PSClient(cluster.endpoints, ClientConfig(transport=transport)) as client:
        for spec in tables.values():
            client.create_table(spec)
        steps = StepClient(client, StepJob(table_name), wire_dtypes=wire)
        before = {name: client.pull(name, ids) for name in tables}  # float32 over Pull

        rows, _ = steps.lookup({name: ids for name in tables})  # one mixed-dtype frame per shard
        for name, dtype in wire.items():  # each packed exactly as Tensor.to packs
            assert torch.equal(rows[name], before[name].to(TORCH_DTYPES[dtype]).float()), name

        refreshed, _ = steps.update(
            {name: (ids, grads[name]) for name in tables}, 0, {name: ids[:50] for name in tables}
        )
        for name, dtype in wire.items():
            sent = grads[name].to(TORCH_DTYPES[dtype]).double()  # what the wire carried
            expected = before[name].double() - LR * sent  # SGD in float64 on float32 rows
            after = client.pull(name, ids)
            np.testing.assert_allclose(after.double(), expected, rtol=1e-6, atol=1e-7)
            if dtype is not RowDtype.FLOAT32:  # the shard's rows are float32, not the wire's
                assert not torch.equal(after, after.to(TORCH_DTYPES[dtype]).float()), name
            positions, values = refreshed[name]
            order = torch.argsort(positions)
            assert positions[order].tolist() == list(range(50))
            assert torch.equal(values[order], after[:50].to(TORCH_DTYPES[dtype]).float()), name


def test_narrow_rows_save_two_bytes_per_element_of_every_lookup_and_update(
    cluster, table_name, transport
):
    ids = torch.arange(1000)
    sizes = {}
    with PSClient(cluster.endpoints, ClientConfig(transport=transport)) as client:
        for dtype in (RowDtype.FLOAT32, RowDtype.BFLOAT16):
            name = f"{table_name}.{dtype.name.lower()}"
            client.create_table(TableSpec(name, DIM))
            steps = StepClient(client, StepJob(name), wire_dtypes={name: dtype})
            steps.lookup({name: ids})
            looked_up = steps.wire_bytes
            steps.update({name: (ids, torch.ones(len(ids), DIM))}, 0)
            sizes[dtype] = (looked_up, steps.wire_bytes - looked_up)
    element_bytes_saved = len(ids) * DIM * 2  # per message that carries every row
    for full, narrow in zip(sizes[RowDtype.FLOAT32], sizes[RowDtype.BFLOAT16], strict=True):
        # give or take the dtype fields and the shorter length prefixes
        assert abs(full - narrow - element_bytes_saved) <= 32, (full, narrow)


def test_a_gradient_beyond_float16_is_refused_before_anything_is_sent(
    cluster, table_name, transport
):
    ids = torch.arange(100, 110)
    with PSClient(cluster.endpoints, ClientConfig(transport=transport)) as client:
        client.create_table(TableSpec(table_name, DIM))
        steps = StepClient(client, StepJob(table_name), wire_dtypes={table_name: "float16"})
        grads = torch.ones(len(ids), DIM)
        grads[6, 3] = 70_000.0
        with pytest.raises(
            OutOfRangeError, match="the row of id 106 holds 70000, beyond the range of float16"
        ):
            steps.update({table_name: (ids, grads)}, 0)
        assert steps.wire_bytes == 0
        assert client.pull_with_versions(table_name, ids)[1].eq(0).all()
        bf16 = StepClient(client, StepJob(table_name + "-b"), wire_dtypes={table_name: "bfloat16"})
        bf16.update({table_name: (ids, grads)}, 0)  # bfloat16 has float32's range
        assert client.pull_with_versions(table_name, ids)[1].eq(1).all()


def test_a_row_beyond_float16_is_refused_out_of_range_and_readable_as_bfloat16(
    cluster, table_name, transport
):
    ids = torch.arange(6)
    with PSClient(cluster.endpoints, ClientConfig(transport=transport)) as client:
        client.create_table(TableSpec(table_name, DIM))
        values = torch.full((len(ids), DIM), 0.25)
        values[4, 0] = -1e6
        client.assign(table_name, ids, values)
        narrow = StepClient(client, StepJob(table_name), wire_dtypes={table_name: "float16"})
        with pytest.raises(PSClientError) as refused:
            narrow.lookup({table_name: ids})
        assert refused.value.code == Status.OUT_OF_RANGE
        assert "beyond the range of float16" in refused.value.details
        wide = StepClient(client, StepJob(table_name), wire_dtypes={table_name: "bfloat16"})
        rows, _ = wide.lookup({table_name: ids})
        assert torch.equal(rows[table_name], values.to(torch.bfloat16).float())


def test_an_unknown_dtype_is_invalid_argument(cluster, table_name):
    with PSClient(cluster.endpoints) as client:
        client.create_table(TableSpec(table_name, DIM))
        ids = _shard0_ids(client, table_name)
        request = encode_lookup_request([(table_name, encode_ids(ids), 7)], None)
        with pytest.raises(PSClientError) as refused:
            client.shard_rpc.run([ShardCall(0, "Lookup", request)])
        assert refused.value.code == Status.INVALID_ARGUMENT
        assert "unknown row dtype 7" in refused.value.details


def test_a_wire_dtype_must_be_one_the_wire_knows(client, table_name):
    with pytest.raises(ValueError, match="row dtype must be one of float32, float16, bfloat16"):
        StepClient(client, StepJob(table_name), wire_dtypes={table_name: "float8"})


def test_a_refreshed_row_beyond_float16_comes_back_as_float32_and_the_clock_counts(
    cluster, table_name, transport
):
    ids = torch.arange(40)
    with PSClient(cluster.endpoints, ClientConfig(transport=transport)) as client:
        client.create_table(TableSpec(table_name, DIM, optimizer=OptimizerSpec(lr=LR)))
        values = torch.full((len(ids), DIM), 0.1)  # 0.1 - 0.5 is not a float16
        values[2, 5] = 1e6
        client.assign(table_name, ids, values)
        steps = StepClient(client, StepJob(table_name), wire_dtypes={table_name: "float16"})
        refreshed, _ = steps.update(
            {table_name: (ids, torch.ones(len(ids), DIM))}, 0, {table_name: ids}
        )
        rows, versions = client.pull_with_versions(table_name, ids)
        assert versions.eq(2).all()  # assigned, then stepped once
        positions, values = refreshed[table_name]
        order = torch.argsort(positions)
        assert positions[order].tolist() == list(range(len(ids)))
        values = values[order]
        shards = shard_of(table_name, ids.numpy(), client.num_shards)
        wide = torch.from_numpy(shards == shards[2])  # the entry that holds the big row
        assert 0 < int(wide.sum()) < len(ids)
        assert torch.equal(values[wide], rows[wide])  # float32 for that whole entry, exactly
        narrow = rows[~wide].to(torch.float16).float()  # the other shard's entry stays packed
        assert torch.equal(values[~wide], narrow) and not torch.equal(narrow, rows[~wide])


def _shard0_ids(client: PSClient, table: str, count: int = 40) -> np.ndarray:
    ids = np.arange(count * client.num_shards)
    return ids[shard_of(table, ids, client.num_shards) == 0]


def test_packed_infinities_from_a_hand_built_client_are_refused_and_change_nothing(
    cluster, table_name
):
    with PSClient(cluster.endpoints) as client:
        client.create_table(TableSpec(table_name, DIM))
        ids = _shard0_ids(client, table_name)
        grads = np.zeros((len(ids), DIM), dtype=np.uint16)
        grads[3, 1] = 0x7C00  # float16 +Inf
        clock = StepJob(table_name).clock(0)
        entry = (table_name, encode_ids(ids), grads, RowDtype.FLOAT16)
        request = encode_update_request([entry], clock)
        with pytest.raises(PSClientError) as refused:
            client.shard_rpc.run([ShardCall(0, "Update", request, tables=1, clock=0)])
        assert refused.value.code == Status.INVALID_ARGUMENT
        assert "NaN or Inf (first at row 3" in refused.value.details
        assert client.pull_with_versions(table_name, torch.from_numpy(ids))[1].eq(0).all()


@pytest.mark.parametrize("where", ["grads", "refresh"])
def test_an_unknown_dtype_in_an_update_is_invalid_argument_and_changes_nothing(
    cluster, table_name, where
):
    with PSClient(cluster.endpoints) as client:
        client.create_table(TableSpec(table_name, DIM))
        ids = _shard0_ids(client, table_name)
        grads = np.ones((len(ids), DIM), dtype=np.float32)
        grads_dtype, refresh_dtype = (-1, 0) if where == "grads" else (0, 3)
        request = encode_update_request(
            [(table_name, encode_ids(ids), grads, grads_dtype)], StepJob(table_name).clock(0),
            [(table_name, encode_ids(ids), refresh_dtype)],
        )  # fmt: skip
        with pytest.raises(PSClientError) as refused:
            client.shard_rpc.run([ShardCall(0, "Update", request, tables=1, clock=0)])
        assert refused.value.code == Status.INVALID_ARGUMENT
        assert f"unknown row dtype {grads_dtype or refresh_dtype}" in refused.value.details
        assert client.pull_with_versions(table_name, torch.from_numpy(ids))[1].eq(0).all()


def test_a_wire_dtype_for_a_table_that_does_not_exist_is_not_found(client, table_name):
    with pytest.raises(PSClientError) as missing:
        StepClient(client, StepJob(table_name), wire_dtypes={table_name + "-typo": "bfloat16"})
    assert missing.value.code == Status.NOT_FOUND
