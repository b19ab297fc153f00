"""Keepalive settings: both sides refuse a ping interval a shard would not accept, and a
shard accepts pings from any client setting it allows."""

import pytest
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.shard.config import ShardConfig
from ember.ps_server.wire.keepalive import MIN_KEEPALIVE_S, keepalive_options


@pytest.mark.parametrize("config", [ClientConfig, ShardConfig])
def test_a_keepalive_below_what_shards_accept_is_refused_by_name(config):
    for wrong in (0.5, float("inf"), float("nan"), 1e7):
        with pytest.raises(ValueError, match=f"keepalive_s must be in 1.0..86400.0, got {wrong}"):
            config(keepalive_s=wrong).validate()
    config(keepalive_s=MIN_KEEPALIVE_S).validate()


def test_a_shard_accepts_pings_as_often_as_the_most_frequent_client_sends_them():
    server = dict(keepalive_options(60.0, server=True))
    client = dict(keepalive_options(MIN_KEEPALIVE_S, server=False))
    assert server["grpc.http2.min_ping_interval_without_data_ms"] < client["grpc.keepalive_time_ms"]
    assert client["grpc.http2.max_pings_without_data"] == 0  # a held call sends no data
    assert client["grpc.http2.ping_timeout_ms"] == 5_000  # a busy host is not a dead one
    assert dict(keepalive_options(20.0, server=False))["grpc.http2.ping_timeout_ms"] == 20_000
