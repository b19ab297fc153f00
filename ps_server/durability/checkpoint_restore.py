"""Restoring one shard from a checkpoint chain: presize, load the rows it owns, read its
metadata (push deduplication windows, step clocks, replica jobs)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ember.ps_server.durability.checkpoint_format import Manifest, read_row_file
from ember.ps_server.durability.durable_files import read_verified
from ember.ps_server.errors import CheckpointStateError, DurableFileCorruptError
from ember.ps_server.routing import shard_of
from ember.ps_server.shard.step_clocks import MAX_WORLD, sound_job_name
from ember.ps_server.shard.table import Table

log = logging.getLogger(__name__)


def restore_chain(
    chain: list[tuple[Path, Manifest]],
    shard: int,
    num_shards: int,
    tables: dict[str, Table],
    verified: bool = True,
) -> int:
    """Load a checkpoint chain (see ``checkpoint_chain``) into ``tables``; returns rows.
    Unless ``verified``, each file's sha256 is checked while it is read.

    ``tables`` must already hold a table for every spec of the checkpoint
    (see :func:`check_specs`); they are reset first, so afterwards they
    equal the checkpoint's rows that this shard owns.
    """
    directory, latest = chain[-1]
    windows = shard_meta(directory, latest, shard, num_shards).get("applied_request_ids", {})
    for spec in latest.tables:
        tables[spec.name].reset(windows.get(spec.name, []))
    _reserve_rows(chain, shard, num_shards, tables)
    restored = 0
    for checkpoint_dir, manifest in chain:
        for entry in manifest.files_for(shard, num_shards):
            if entry.table:
                if entry.table not in tables:
                    raise DurableFileCorruptError(
                        f"{checkpoint_dir / entry.path}: rows of table {entry.table!r}, which "
                        f"checkpoint {latest.id} does not list"
                    )
                restored += _load_row_file(
                    checkpoint_dir / entry.path, tables[entry.table], shard, num_shards,
                    None if verified else entry.sha256,
                )  # fmt: skip
    log.info(
        "restored %d rows of %d tables from %s (%d checkpoint(s), %d shard(s) -> %d)",
        restored, len(latest.tables), directory, len(chain), latest.num_shards, num_shards,
    )  # fmt: skip
    return restored


def _reserve_rows(
    chain: list[tuple[Path, Manifest]], shard: int, num_shards: int, tables: dict[str, Table]
) -> None:
    """Size each table for the rows of the chain's full checkpoint (its manifest counts
    them; onto another shard count, this shard's even share): loading it never regrows a
    store, and increments, mostly rows already there, never make it reserve too much."""
    _, full = chain[0]
    share = 1 if full.num_shards == num_shards else num_shards
    expected: dict[str, int] = {}
    for entry in full.files_for(shard, num_shards):
        if entry.table in tables:
            expected[entry.table] = expected.get(entry.table, 0) + -(-entry.rows // share)
    for name, rows in expected.items():
        tables[name].reserve(rows)


def check_specs(latest: Manifest, existing: dict[str, Table]) -> None:
    """Refuse a checkpoint whose table specs clash with ``existing`` tables.

    Raises:
        CheckpointStateError: a table exists here with another spec.
    """
    for spec in latest.tables:
        held = existing.get(spec.name)
        if held is not None and held.spec != spec:
            raise CheckpointStateError(
                f"checkpoint {latest.id} has table {spec.name!r} as {spec}, but this shard "
                f"serves it as {held.spec}; restore refused, nothing was changed"
            )


def _load_row_file(
    path: Path, table: Table, shard: int, num_shards: int, sha256: str | None
) -> int:
    loaded = 0
    for ids, rows in read_row_file(path, table.spec.dim, table.store.state_width, sha256):
        if num_shards > 1:
            mine = shard_of(table.spec.name, ids, num_shards) == shard
            if not mine.all():
                ids, rows = ids[mine], rows.select(mine)
        if len(ids):
            table.load(ids, rows)
            loaded += len(ids)
    return loaded


def shard_meta(directory: Path, manifest: Manifest, shard: int, num_shards: int) -> dict:
    """This shard's metadata of the checkpoint when the shard count is the same (request ids
    and step clocks are per shard), else ``{}``.

    Raises:
        DurableFileCorruptError: missing or unreadable.
    """
    if manifest.num_shards != num_shards:
        return {}
    meta = [entry for entry in manifest.files_for(shard, num_shards) if not entry.table]
    if len(meta) != 1:
        raise DurableFileCorruptError(
            f"{directory}: the manifest lists {len(meta)} metadata files of shard {shard}, not 1"
        )
    path = directory / meta[0].path
    data = read_verified(path, meta[0].sha256, meta[0].bytes)  # small: whatever the store
    try:
        body = json.loads(data)
        windows, clocks = body["applied_request_ids"], body.get("step_clocks", {})
        if not all(isinstance(ids, list) for ids in windows.values()):
            raise TypeError("a window is not a list")
        for state in clocks.values():
            if not (
                isinstance(state["applied"], list)
                and 1 <= state["world"] <= MAX_WORLD
                and state["world"] == len(state["applied"])
            ):
                raise TypeError("a job's clocks do not match its world")
        replicas = body.get("replica_jobs", {})
        if not all(
            isinstance(replicas.get(key, []), list)
            and all(isinstance(job, str) and sound_job_name(job) for job in replicas.get(key, []))
            for key in ("holding", "released")
        ):
            raise TypeError("replica_jobs must list job names under holding and released")
        return body
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise DurableFileCorruptError(f"{path}: unreadable ({error!r})") from error
