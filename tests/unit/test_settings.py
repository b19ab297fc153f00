"""Settings: one field gives a flag, an environment variable and a checked file key."""

import argparse
import dataclasses
import hmac

import pytest
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.security import credentials
from ember.ps_server.shard.config import ShardConfig
from ember.trainer.config import TrainConfig

from ember.settings import (
    SettingsError,
    add_setting_flags,
    env_name,
    settings_argv,
    settings_from_args,
    settings_from_mapping,
    settings_of,
)


def _parse(cls, argv):
    parser = argparse.ArgumentParser()
    add_setting_flags(parser, cls)
    return settings_from_args(cls, parser.parse_args(argv))


def test_a_flag_beats_its_variable_which_beats_the_default(monkeypatch):
    assert _parse(ShardConfig, []).workers == 32
    monkeypatch.setenv("EMBER_WORKERS", "7")
    monkeypatch.setenv("EMBER_UCX", "yes")
    assert (_parse(ShardConfig, []).workers, _parse(ShardConfig, []).ucx) == (7, True)
    assert _parse(ShardConfig, ["--workers", "3", "--no-ucx"]).workers == 3
    monkeypatch.setenv("EMBER_WORKERS", "many")
    with pytest.raises(ValueError, match="EMBER_WORKERS='many' is not a valid value"):
        _parse(ShardConfig, [])


def test_settings_argv_gives_back_the_same_config():
    config = ShardConfig(workers=3, store="redis://h:1/0", ucx=True, wal_fsync="always")
    assert _parse(ShardConfig, settings_argv(config)) == config
    assert settings_argv(ShardConfig()) == []


def test_a_file_table_becomes_the_config_with_ints_widened_to_floats():
    config = settings_from_mapping(
        ShardConfig, {"workers": 4, "wal_fsync_interval_s": 1, "ucx": True}, "shard"
    )
    assert config == ShardConfig(workers=4, wal_fsync_interval_s=1.0, ucx=True)
    assert isinstance(config.wal_fsync_interval_s, float)


@pytest.mark.parametrize(
    "table, message",
    [
        ({"wokers": 4}, r"shard\.wokers: unknown key \(known: .*workers"),
        ({"workers": "4"}, r"shard\.workers: expected int, got str '4'"),
        ({"workers": True}, r"shard\.workers: expected int, got bool True"),
        ({"ucx": 1}, r"shard\.ucx: expected bool, got int 1"),
        ({"wal_fsync": "never"}, r"shard\.wal_fsync: must be one of always, interval"),
        ({"shard": 1}, r"shard\.shard: unknown key"),  # the launcher numbers shards
    ],
)
def test_a_bad_file_key_is_refused_naming_its_path(table, message):
    with pytest.raises(SettingsError, match=message):
        settings_from_mapping(ShardConfig, table, "shard", skip=("shard",))


def test_optional_settings_take_their_type_or_nothing():
    config = settings_from_mapping(TrainConfig, {"criteo_path": "/d"}, "trainer", endpoints=())
    assert config.criteo_path == "/d"
    with pytest.raises(SettingsError, match="trainer.criteo_path: expected str or nothing"):
        settings_from_mapping(TrainConfig, {"criteo_path": 3}, "trainer", endpoints=())


def test_no_environment_variable_sets_two_settings():
    names = [
        env_name(cls, f)
        for cls in (ShardConfig, ClientConfig, TrainConfig)
        for f in settings_of(cls)
    ]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert env_name(ClientConfig, settings_of(ClientConfig)[0]) == "EMBER_CLIENT_TIMEOUT_S"


def test_each_side_reads_its_own_variables(monkeypatch):
    monkeypatch.setenv("EMBER_CLIENT_TIMEOUT_S", "7.5")
    monkeypatch.setenv("EMBER_TRAIN_STEPS", "9")
    monkeypatch.setenv("EMBER_TORCH_THREADS", "3")  # the shard's
    monkeypatch.setenv("EMBER_STEPS", "11")  # nobody's
    assert _parse(ClientConfig, []).timeout_s == 7.5
    parser = argparse.ArgumentParser()
    add_setting_flags(parser, TrainConfig)
    args = parser.parse_args([])
    assert (args.steps, args.torch_threads) == (9, 0)
    assert _parse(ShardConfig, []).torch_threads == 3


def test_every_setting_has_help_and_a_distinct_flag():
    for cls in (ShardConfig, ClientConfig, TrainConfig):
        parser = argparse.ArgumentParser()
        add_setting_flags(parser, cls)  # argparse refuses a flag given twice
        fields = [f for f in dataclasses.fields(cls) if f.name not in ("endpoints", "client")]
        assert all(f.metadata.get("ember.help") for f in fields), cls


def test_the_token_is_compared_in_constant_time(monkeypatch):
    calls = []

    def recording(a, b):
        calls.append((a, b))
        return a == b

    monkeypatch.setattr(hmac, "compare_digest", recording)
    token = b"0123456789abcdef"
    assert credentials.token_matches(token, "Bearer 0123456789abcdef")
    assert not credentials.token_matches(token, "Bearer 0123456789abcdeX")
    assert not credentials.token_matches(token, None)
    digest = credentials._digest
    assert calls == [
        (digest(b"Bearer " + token), digest(b"Bearer 0123456789abcdef")),
        (digest(b"Bearer " + token), digest(b"Bearer 0123456789abcdeX")),
    ]
    assert {len(a) for pair in calls for a in pair} == {32}  # the length of neither leaks


@pytest.mark.parametrize(
    "content, message",
    [("short", "at least 16"), ("has a space 0123456789", "without spaces"), ("", "at least 16")],
)
def test_weak_or_unreadable_tokens_are_refused(tmp_path, content, message):
    path = tmp_path / "token"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        credentials.load_token(str(path))
    with pytest.raises(ValueError, match="cannot read the token file"):
        credentials.load_token(str(tmp_path / "missing"))


def test_the_token_comes_from_the_file_else_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(credentials.TOKEN_ENV, raising=False)
    assert credentials.load_token("") is None
    monkeypatch.setenv(credentials.TOKEN_ENV, "from-the-environment-0123")
    assert credentials.load_token("") == b"from-the-environment-0123"
    path = tmp_path / "token"
    path.write_text("from-the-file-0123456789\n")
    assert credentials.load_token(str(path)) == b"from-the-file-0123456789"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"tls_cert": "/c.pem"}, "tls_cert and tls_key go together"),
        ({"tls_client_ca": "/ca.pem"}, "tls_client_ca .mutual TLS. needs tls_cert"),
    ],
)
def test_incomplete_tls_settings_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        ShardConfig(**change).validate()


def test_exiting_on_a_fault_needs_a_write_ahead_log():
    """Without one, a shard started again cannot tell an emptied Redis from a new one."""
    with pytest.raises(ValueError, match="exit_on_fault needs a write-ahead log"):
        ShardConfig(exit_on_fault=True).validate()
    ShardConfig(exit_on_fault=True, wal="/var/lib/ember/wal").validate()


def test_ucx_beside_tls_needs_the_network_to_be_declared_trusted():
    ShardConfig(ucx=True).check_ucx_trust()
    ShardConfig(ucx=True, token_file="/t").check_ucx_trust()  # UCX checks the token itself
    tls = {"tls_cert": "/c", "tls_key": "/k"}
    with pytest.raises(ValueError, match="UCX data plane is not encrypted"):
        ShardConfig(ucx=True, **tls).check_ucx_trust()
    ShardConfig(ucx=True, ucx_unencrypted=True, **tls).check_ucx_trust()


@pytest.mark.parametrize(
    ("workers", "asking", "waiting"),
    [(128, 4, 96), (64, 4, 48), (32, 2, 24), (16, 1, 12), (8, 1, 5), (4, 1, 1)],
)
def test_a_shard_keeps_workers_for_calls_that_never_wait_and_for_flush_requests(
    workers, asking, waiting
):
    config = ShardConfig(workers=workers)
    assert (config.max_asking, config.max_waiting) == (asking, waiting)
    # Two at least for the rest: a checkpoint waiting for its cut, and the update it needs.
    assert workers - config.max_waiting - config.max_asking >= 2


def test_more_workers_never_give_fewer_wait_slots_and_the_readme_sizing_suffices():
    waiting = [ShardConfig(workers=w).max_waiting for w in range(4, 257)]
    assert waiting == sorted(waiting)
    for needed in range(1, 100):  # the README: at least N x 4/3 and N + 3
        workers = max(needed + 3, -(-needed * 4 // 3))
        assert ShardConfig(workers=workers).max_waiting >= needed, needed


def test_a_shard_needs_four_workers():
    with pytest.raises(ValueError, match="workers must be >= 4"):
        ShardConfig(workers=3).validate()
    ShardConfig(workers=4).validate()


def test_the_restart_patience_must_not_be_negative():
    with pytest.raises(ValueError, match="restart_patience_s"):
        ClientConfig(restart_patience_s=-1).validate()
