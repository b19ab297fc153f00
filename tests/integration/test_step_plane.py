"""The step data plane against real shards: clocked lookups and exact updates of 2 ranks."""

import threading

import numpy as np
import pytest
import torch
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.client.step_client import StepClient
from ember.ps_server.client.step_job import StepJob
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.errors import PSClientError, Status
from ember.ps_server.shard.initializers import initial_rows
from ember.ps_server.ucx import ucx_missing
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec

from tests.support.held_updates import wait_until_held, wait_until_withdrawn
from tests.support.reference import ReferenceRow

ADAM = OptimizerSpec(OptimizerKind.ADAM, lr=0.05)


def spec(name: str) -> TableSpec:
    return TableSpec(name, dim=4, optimizer=ADAM)


@pytest.mark.parametrize("rides", [False, True], ids=["lookups", "reads-riding-on-updates"])
def test_two_ranks_in_exact_mode_step_each_row_once_per_clock_with_the_summed_gradient(
    cluster, table_name, transport, rides
):
    """Each rank reads every rank's earlier clocks: with a lookup naming the clock, or with
    the next step's read riding on this step's update (answered once both ranks' are in)."""
    tables = [spec(table_name + ".a"), spec(table_name + ".b")]
    ids = torch.arange(0, 300, 3)
    steps = 3
    grads = {
        (rank, step, t.name): torch.randn(len(ids), 4, generator=torch.Generator().manual_seed(
            rank * 100 + step * 10 + n))
        for rank in range(2) for step in range(steps) for n, t in enumerate(tables)
    }  # fmt: skip
    seen, errors = {}, []

    def rank_loop(rank: int) -> None:
        try:
            with PSClient(cluster.endpoints, ClientConfig(transport=transport)) as client:
                for t in tables:
                    client.create_table(t)
                steps_client = StepClient(
                    client, StepJob(table_name, world=2, rank=rank, wait_s=30)
                )
                read = {t.name: ids for t in tables}
                rows = None
                for step in range(steps):
                    if rows is None:
                        rows, watermark = steps_client.lookup(read, step - 1)
                        assert watermark >= step - 1
                    seen[(rank, step)] = rows
                    update = {t.name: (ids, grads[(rank, step, t.name)]) for t in tables}
                    if rides:
                        answer = steps_client.update_and_read(update, step, read=read)
                        assert answer.watermark >= step
                        rows = answer.rows
                    else:
                        steps_client.update(update, step)
                        rows = None
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=rank_loop, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    for n, t in enumerate(tables):
        reference = [ReferenceRow(r, ADAM) for r in initial_rows(t, ids.numpy()).numpy()]
        for step in range(steps):
            for rank in range(2):  # both ranks read the same rows: every rank's earlier clocks
                np.testing.assert_allclose(
                    seen[(rank, step)][t.name].numpy(), np.stack([r.w for r in reference]),
                    rtol=1e-5, atol=1e-6,
                )  # fmt: skip
            summed = grads[(0, step, t.name)] + grads[(1, step, t.name)]
            for row, grad in zip(reference, summed.numpy()):
                row.apply(grad)
        with PSClient(cluster.endpoints, ClientConfig(transport=transport)) as client:
            rows, versions = client.pull_with_versions(t.name, ids)
        assert versions.eq(steps).all()  # one step per clock, not one per rank
        np.testing.assert_allclose(
            rows.numpy(), np.stack([r.w for r in reference]), rtol=1e-5, atol=1e-6
        )


def test_an_update_hands_back_the_refresh_rows_its_clock_changed_from_every_shard(
    cluster, table_name, transport
):
    t = spec(table_name)
    with PSClient(cluster.endpoints, ClientConfig(transport=transport)) as client:
        client.create_table(t)
        steps = StepClient(client, StepJob(table_name, world=1))
        ids, later = torch.arange(0, 40, 2), torch.tensor([38, 1, 0, 7, 20])
        refreshed, watermark = steps.update(
            {t.name: (ids, torch.ones(len(ids), 4))}, 0, {t.name: later}
        )
        assert watermark == 0
        positions, rows = refreshed[t.name]
        order = torch.argsort(positions)
        assert positions[order].tolist() == [0, 2, 4]  # 38, 0 and 20 changed; 1 and 7 did not
        assert torch.equal(rows[order], client.pull(t.name, later[[0, 2, 4]]))


def test_a_read_riding_on_an_update_comes_back_again_with_a_retry_and_only_in_exact_mode(
    cluster, table_name, transport
):
    t = spec(table_name)
    with PSClient(cluster.endpoints, ClientConfig(transport=transport)) as client:
        client.create_table(t)
        steps = StepClient(client, StepJob(table_name, world=1))
        ids, read = torch.arange(0, 40, 2), {t.name: torch.tensor([38, 1, 38, 7])}  # repeats
        update = {t.name: (ids, torch.ones(len(ids), 4))}
        answers = [steps.update_and_read(update, 0, read=read) for _ in range(2)]  # a retry
        expected = client.pull(t.name, read[t.name])
        for answer in answers:
            assert answer.watermark == 0 and torch.equal(answer.rows[t.name], expected)
        assert client.pull_with_versions(t.name, ids)[1].eq(1).all()  # applied once
        async_steps = StepClient(client, StepJob(table_name + "-async", mode="async"))
        with pytest.raises(ValueError, match="exact mode only"):
            async_steps.update_and_read(update, 0, read=read)
        assert client.pull_with_versions(t.name, ids)[1].eq(1).all()  # nothing sent


def test_a_rank_that_never_arrives_fails_the_others_within_the_wait_naming_it(
    cluster, table_name, transport
):
    t = spec(table_name)
    with PSClient(cluster.endpoints, ClientConfig(transport=transport)) as client:
        client.create_table(t)
        steps = StepClient(client, StepJob(table_name, world=3, rank=0, wait_s=0.5))
        with pytest.raises(PSClientError) as failed:
            steps.update({t.name: (torch.arange(4), torch.ones(4, 4))}, 0)
        assert failed.value.code == Status.DEADLINE_EXCEEDED
        assert "rank(s) 1, 2 have not delivered clock 0" in failed.value.details
        assert client.pull_with_versions(t.name, torch.arange(4))[1].eq(0).all()  # not in part


def test_a_refresh_that_no_row_of_the_clock_touched_comes_back_empty(
    cluster, table_name, transport
):
    t = spec(table_name)
    with PSClient(cluster.endpoints, ClientConfig(transport=transport)) as client:
        client.create_table(t)
        steps = StepClient(client, StepJob(table_name, world=1))
        refreshed, _ = steps.update({t.name: (torch.arange(4), torch.ones(4, 4))}, 0,
                                    {t.name: torch.tensor([100, 200, 300])})  # fmt: skip
        positions, rows = refreshed[t.name]
        assert positions.tolist() == [] and tuple(rows.shape) == (0, 4)


def test_a_lookup_of_several_widths_reads_what_pull_reads_on_every_transport(
    cluster, table_name, transport
):
    # Widths out of order, duplicates, a table without ids: rows come back joined per
    # shard and land where each table's ids ask.
    specs = [TableSpec(f"{table_name}.w{n}", dim=d) for n, d in enumerate([4, 2, 4, 7])]
    ids = [torch.tensor([5, 1, 5, 9, 300, 1]), torch.arange(50),
           torch.empty(0, dtype=torch.int64), torch.arange(100, 0, -3)]  # fmt: skip
    with PSClient(cluster.endpoints, ClientConfig(transport=transport)) as client:
        for spec_, table_ids in zip(specs, ids):
            client.create_table(spec_)
            client.push(
                spec_.name, table_ids.unique(), torch.randn(len(table_ids.unique()), spec_.dim)
            )
        rows, _ = StepClient(client, StepJob(table_name)).lookup(
            {spec_.name: table_ids for spec_, table_ids in zip(specs, ids)}
        )
        for spec_, table_ids in zip(specs, ids):
            assert torch.equal(rows[spec_.name], client.pull(spec_.name, table_ids)), spec_.name


def test_wire_bytes_count_every_message_both_ways(cluster, table_name, transport):
    table = spec(table_name)
    ids = torch.arange(500)
    with PSClient(cluster.endpoints, ClientConfig(transport=transport)) as client:
        client.create_table(table)
        steps = StepClient(client, StepJob(table_name, world=1, rank=0))
        steps.lookup({table.name: ids})
        payload = len(ids) * 8 + len(ids) * 4 * table.dim  # ids out, rows back
        after_lookup = steps.wire_bytes
        # framing per shard message: a table name, lengths, tags; not per id
        assert payload < after_lookup < payload + 4 * 100
        steps.update({table.name: (ids, torch.ones(len(ids), table.dim))}, clock=0)
        sent = steps.wire_bytes - after_lookup
        assert len(ids) * (8 + 4 * table.dim) < sent < len(ids) * (8 + 4 * table.dim) + 4 * 200


def test_an_update_sent_again_for_its_clock_is_applied_once(cluster, table_name, transport):
    t = spec(table_name)
    ids = torch.arange(10)
    with PSClient(cluster.endpoints, ClientConfig(transport=transport)) as client:
        client.create_table(t)
        steps = StepClient(client, StepJob(table_name, world=1))
        steps.update({t.name: (ids, torch.ones(len(ids), 4))}, 0)
        once = client.pull_with_versions(t.name, ids)
        steps.update({t.name: (ids, torch.ones(len(ids), 4))}, 0)  # as a retry resends it
        again = client.pull_with_versions(t.name, ids)
    assert once[1].eq(1).all()
    assert torch.equal(once[0], again[0]) and torch.equal(once[1], again[1])


def test_a_shard_gone_mid_call_is_unavailable_on_every_transport(table_name, transport):
    t = spec(table_name)
    ids = torch.arange(8)
    config = ClientConfig(transport=transport, max_attempts=2, initial_backoff_s=0.01)
    with (
        LocalCluster(1, ["--ucx"] if transport == "ucx" else []) as one,
        PSClient(one.endpoints, config) as client,
    ):
        client.create_table(t)
        held = StepClient(client, StepJob(table_name, world=2, rank=0, wait_s=60))
        failures = []

        def update() -> None:
            try:
                held.update({t.name: (ids, torch.ones(len(ids), 4))}, 0)
            except PSClientError as error:
                failures.append(error)

        sender = threading.Thread(target=update)
        sender.start()
        wait_until_held(one.endpoints, table_name, table_name, ids)
        one.kill_shard(0)
        sender.join(30)
    (failure,) = failures
    assert failure.code == Status.UNAVAILABLE, failure
    assert "gave up after 2 attempts" in failure.details


def test_a_restarted_shard_is_found_again_on_every_transport(table_name, transport):
    t = spec(table_name)
    config = ClientConfig(transport=transport, initial_backoff_s=0.01)
    with (
        LocalCluster(1, ["--ucx"] if transport == "ucx" else []) as one,
        PSClient(one.endpoints, config) as client,
    ):
        client.create_table(t)
        steps = StepClient(client, StepJob(table_name, world=1))
        before, _ = steps.lookup({t.name: torch.arange(5)})
        one.kill_shard(0)
        one.restart_shard(0)  # same gRPC port, a new UCX port
        client.create_table(t)  # the memory store starts empty
        after, _ = steps.lookup({t.name: torch.arange(5)})
    assert torch.equal(before[t.name], after[t.name])  # the same initial rows


def _close_while_an_update_is_held(cluster, table_name: str, transport: str) -> list:
    """Rank 0 of a 2-rank job sends clock 0 (held for rank 1), then its client closes; the
    errors its update ended with."""
    t = spec(table_name)
    client = PSClient(cluster.endpoints, ClientConfig(transport=transport))
    client.create_table(t)
    held = StepClient(client, StepJob(table_name, world=2, rank=0, wait_s=60))
    failures = []

    def update() -> None:
        try:
            held.update({t.name: (torch.arange(4), torch.ones(4, 4))}, 0)
        except PSClientError as error:
            failures.append(error)

    sender = threading.Thread(target=update)
    sender.start()
    wait_until_held(cluster.endpoints, table_name, table_name, torch.arange(4))
    client.close()
    sender.join(10)
    assert not sender.is_alive(), "the call outlived its client"
    return failures


def test_closing_the_client_cancels_a_call_in_flight_on_every_transport(
    cluster, table_name, transport
):
    failures = _close_while_an_update_is_held(cluster, table_name, transport)
    assert [failure.code for failure in failures] == [Status.CANCELLED], failures


def test_a_client_gone_mid_wait_frees_the_shard_at_once_and_withdraws_its_update(
    cluster, table_name, transport
):
    """The shard watches the caller (gRPC: the call; UCX: the connection): when the client
    goes, its update that waited for rank 1 stops waiting (freeing a wait slot and a worker
    thread) and is withdrawn, as after a timeout, rather than held for its 60 s wait."""
    t = spec(table_name)
    failures = _close_while_an_update_is_held(cluster, table_name, transport)
    assert [failure.code for failure in failures] == [Status.CANCELLED], failures
    wait_until_withdrawn(cluster.endpoints, table_name, t.name, torch.arange(4), within_s=20)


def test_a_step_message_over_the_limit_is_resource_exhausted_on_every_transport(
    cluster, table_name, transport
):
    t = spec(table_name)
    config = ClientConfig(transport=transport, max_message_bytes=1 << 16)
    with PSClient(cluster.endpoints, config) as client:
        client.create_table(t)
        steps = StepClient(client, StepJob(table_name, world=1))
        with pytest.raises(PSClientError) as refused:
            steps.lookup({t.name: torch.arange(40_000)})  # 320 kB of ids
    assert refused.value.code == Status.RESOURCE_EXHAUSTED, refused.value


def test_a_request_over_the_shards_smaller_limit_is_resource_exhausted_on_every_transport(
    table_name, transport
):
    flags = [*([] if ucx_missing() else ["--ucx"]), "--max-message-bytes", str(1 << 16)]
    with (
        LocalCluster(2, flags) as small,
        PSClient(small.endpoints, ClientConfig(transport=transport)) as client,
    ):
        client.create_table(spec(table_name))
        steps = StepClient(client, StepJob(table_name, world=1))
        with pytest.raises(PSClientError) as refused:
            steps.lookup({table_name: torch.arange(40_000)})  # 320 kB of ids
        assert refused.value.code == Status.RESOURCE_EXHAUSTED, refused.value
        if transport == "ucx":  # refused before sending: the shard said its limit
            assert "over the 65536-byte message limit" in refused.value.details
        rows, _ = steps.lookup({table_name: torch.arange(1_000)})  # the plane goes on
        assert torch.equal(rows[table_name], client.pull(table_name, torch.arange(1_000)))


def test_a_reply_over_the_clients_limit_is_resource_exhausted_and_the_next_call_works(
    cluster, table_name, transport
):
    config = ClientConfig(transport=transport, max_message_bytes=1 << 16)
    with PSClient(cluster.endpoints, config) as client:
        client.create_table(spec(table_name))
        steps = StepClient(client, StepJob(table_name, world=1))
        with pytest.raises(PSClientError) as refused:
            steps.lookup(
                {table_name: torch.arange(12_000)}
            )  # per shard: 48 kB of ids, 96 kB of rows
        assert refused.value.code == Status.RESOURCE_EXHAUSTED, refused.value
        reply_side = {"grpc": "Received message larger than max", "ucx": "unreadable reply"}
        assert reply_side[transport] in refused.value.details  # the reply, not the request
        rows, _ = steps.lookup({table_name: torch.arange(1_000)})
        assert torch.equal(rows[table_name], client.pull(table_name, torch.arange(1_000)))
