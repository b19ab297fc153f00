"""The cluster file: what it may say, and how each launcher places it."""

import pytest

from ember.deploy.cluster_file import cluster_from_mapping, load_cluster_file
from ember.deploy.compose import compose_document
from ember.deploy.topology import Placement, shard_config, store_url
from ember.settings import SettingsError

MINIMAL = {"shards": 2}


@pytest.mark.parametrize(
    "document, message",
    [
        ({"shard": {"wokers": 3}}, r"^shard\.wokers: unknown key"),
        ({"trainer": {"ranks": 2, "stpes": 3}}, r"^trainer\.stpes: unknown key"),
        ({"trainer": {"steps": "many"}}, r"^trainer\.steps: expected int, got str"),
        ({"trainer": {"ranks": "2"}}, r"^trainer\.ranks: expected int"),
        ({"client": {"timeout_s": "1s"}}, r"^client\.timeout_s: expected float"),
        ({"redis": {"tier_rows": 1.5}}, r"^redis\.tier_rows: expected int"),
        ({"redis": {"capacity": 1}}, r"^redis\.capacity: unknown key"),
        ({"durability": {"wal": "yes"}}, r"^durability\.wal: expected bool"),
        ({"shards": "2"}, r"^shards: expected int"),
        ({"shard": {"store": "memory"}}, r"^shard\.store: unknown key"),  # placed by launchers
        ({"shard": {"port": 1}}, r"^shard\.port: unknown key"),
        ({"monitor": {}}, r"^monitor: unknown key"),
        ({"shard": 3}, r"^shard: expected a table"),
        ({"client": {"token_file": "/t"}}, r"^client\.token_file: unknown key"),  # not served
        ({"client": {"transport": "ucx"}}, r"^client\.transport: unknown key"),
    ],
)
def test_unknown_keys_and_wrong_types_are_refused_naming_the_key_path(document, message):
    with pytest.raises(SettingsError, match=message):
        cluster_from_mapping({**MINIMAL, **document})


def test_out_of_range_values_are_refused_naming_the_file(tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_text("shards = 2\n[trainer]\nranks = 0\n")
    with pytest.raises(SettingsError, match=r"cluster.toml: trainer.ranks must be in 1..64"):
        load_cluster_file(path)
    path.write_text("shards = 2\n[shard]\nworkers = 0\n")
    with pytest.raises(SettingsError, match=r"cluster.toml: \[shard\] workers must be >= 4"):
        load_cluster_file(path)
    path.write_text("shards = [")
    with pytest.raises(SettingsError, match=r"cluster.toml: "):
        load_cluster_file(path)


def test_a_spec_is_placed_for_each_launcher():
    spec = cluster_from_mapping(
        {
            "shards": 3,
            "redis": {"tier_rows": 500},
            "durability": {"wal": True},
            "shard": {"workers": 5},
            "client": {"timeout_s": 9.0},
            "trainer": {"ranks": 2, "steps": 7},
        }
    )
    services = compose_document(spec)["services"]
    assert list(services) == ["redis", "shard-0", "shard-1", "shard-2", "trainer"]
    placement = Placement("0.0.0.0", 50051, "redis:6379", "/var/lib/ember")
    config = shard_config(spec, 2, placement)
    assert (config.shard, config.num_shards, config.workers) == (2, 3, 5)
    assert config.store == "tiered+redis://redis:6379/0?capacity=500"
    assert (config.wal, config.checkpoint_root) == ("/var/lib/ember/wal", "")
    assert spec.trainer.train.steps == 7 and spec.trainer.train.client.timeout_s == 9.0
    no_tier = cluster_from_mapping({"redis": {}})
    assert store_url(no_tier, placement) == "redis://redis:6379/0"
    assert store_url(cluster_from_mapping({}), placement) == "memory"
