"""The shard marker's decisions, over an in-process stand-in for the Redis client."""

import json
import threading

import pytest
from ember.ps_server.durability.shard_fault import ShardFault
from ember.ps_server.errors import ShardFailedError, StoreCorruptError, TopologyMismatchError
from ember.ps_server.stores.redis_marker import RedisShardMarker


class DictRedis:
    """GET, SET and SCAN over a dict; ``set`` hands the GIL over, as a network call does."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.sets = 0

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def set(self, key: bytes, value: bytes) -> None:
        for _ in range(100):
            threading.Event().wait(0)  # let other threads run mid-write
        self.data[key] = value
        self.sets += 1

    def info(self, section: str) -> dict:
        return {"run_id": "0" * 40}

    def scan_iter(self, match: bytes, count: int):
        return [key for key in list(self.data) if key.startswith(match.rstrip(b"*"))]


def marker(redis: DictRedis, accept_empty: bool = False, shard: int = 0, shards: int = 2):
    fault = ShardFault()
    return RedisShardMarker(redis, "redis://test", shard, shards, fault, accept_empty), fault


def test_a_lost_marker_stops_the_shard_and_a_new_epoch_stops_the_old_process():
    redis = DictRedis()
    first, first_fault = marker(redis)
    first.start_serving()
    first.verify(redis.get(first.key), first.expected)  # as read with a store's commands
    second, _ = marker(redis)
    second.start_serving()  # a second process of the same shard
    with pytest.raises(ShardFailedError, match="rewritten by another process"):
        first.verify(redis.get(first.key), first.expected)
    assert "rewritten" in first_fault.reason
    redis.data.clear()
    with pytest.raises(ShardFailedError, match="lost this shard's marker"):
        second.verify(redis.get(second.key), second.expected)


@pytest.mark.parametrize("rebuilds", [True, False], ids=["with-log", "without-log"])
def test_only_lost_rows_a_log_rebuilds_are_a_fault_a_restart_repairs(rebuilds):
    """A supervised shard exits on a fault its restart repairs: rows Redis lost, where a log
    rebuilds them. A second owner is never one (each restart would take the shard back)."""
    redis = DictRedis()
    first, first_fault = marker(redis)
    first_fault.supervise()
    first.start_serving(rebuilds=rebuilds)
    second, second_fault = marker(redis)
    second_fault.supervise()
    second.start_serving(rebuilds=rebuilds)
    with pytest.raises(ShardFailedError, match="rewritten by another process"):
        first.verify(redis.get(first.key), first.expected)
    assert not first_fault.restarting
    redis.data.clear()
    with pytest.raises(ShardFailedError, match="lost this shard's marker"):
        second.verify(redis.get(second.key), second.expected)
    assert second_fault.restarting == rebuilds


def test_concurrent_requests_that_find_the_store_emptied_go_on_once_it_is_accepted():
    redis = DictRedis()
    accepting, fault = marker(redis, accept_empty=True)
    accepting.start_serving()
    sent_with = accepting.expected  # every request's read went out before any rewrite
    redis.data.clear()  # Redis restarted empty; every request's pipeline read no marker
    start = threading.Barrier(16)

    def request() -> None:
        start.wait()
        accepting.verify(None, sent_with)

    threads = [threading.Thread(target=request) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert fault.reason is None
    assert redis.sets == 2  # start_serving, then exactly one new epoch for this one loss
    accepting.verify(redis.get(accepting.key), accepting.expected)
    accepting.verify(None, accepting.expected)  # a later, second loss: another new epoch
    assert redis.sets == 3 and fault.reason is None


def test_a_database_of_another_shard_count_or_with_a_garbled_marker_is_refused():
    redis = DictRedis()
    old, _ = marker(redis, shard=0, shards=1)
    old.start_serving()
    new, _ = marker(redis, shard=1, shards=2)
    with pytest.raises(TopologyMismatchError, match="rows of a 1-shard cluster.*shard 1 of 2"):
        new.check_topology()
    redis.data[old.key] = b"not json"
    with pytest.raises(StoreCorruptError, match="marker ember-shard:0 is unreadable"):
        new.check_topology()
    redis.data[old.key] = json.dumps({"format": "ember-shard-marker/1", "num_shards": 2}).encode()
    new.check_topology()  # the same count is fine
