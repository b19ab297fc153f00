import dataclasses

import pytest
import torch
from ember.ps_server.client.config import ClientConfig
from ember.trainer.config import TrainConfig

from ember.cli.main import build_parser
from ember.cli.train_cmd import config_from_args
from ember.deploy.topology import train_argv


def test_train_argv_round_trips_every_config_field():
    cached = TrainConfig(
        endpoints=("127.0.0.1:1", "127.0.0.1:2"), steps=7, batch_size=33, eval_batches=2, dim=12,
        optimizer="sgd", sparse_lr=0.3, dense_lr=0.2, max_cardinality=999, zipf_exponent=1.4, seed=5,
        criteo_path="/data/day_0", table_prefix="x", progress=False, cache="lru", cache_mb=2.5,
        pull_bound=3, push_bound=4, profile_batches=2, device="cpu", heldout_every=7,
        data_path="serial", wait_s=9.5, torch_threads=1, flush_every=10, run_dir="/runs/a",
        metrics_port=9500, metrics_host="0.0.0.0",
        client=ClientConfig(
            timeout_s=3.5, max_attempts=2, restart_patience_s=30.0, initial_backoff_s=0.5,
            max_backoff_s=4.0, max_message_bytes=1 << 20, keepalive_s=5.0, transport="auto",
            tls_ca="/pki/ca.pem", tls_cert="/pki/client.pem", tls_key="/pki/client.key",
            token_file="/pki/token",
        ),
    )  # fmt: skip
    pipelined = dataclasses.replace(
        cached, cache="replicated", data_path="pipeline", staleness=2, update_mode="async",
        wire_dtype="bfloat16",
    )  # fmt: skip
    planned = dataclasses.replace(pipelined, plan="auto", plan_figures="/plans/figures.json")
    sequences = dataclasses.replace(
        cached, model="sasrec", cache="none", data_path="pipeline", criteo_path=None,
        interactions_path="/data/views.csv", max_len=20, negatives=5, balancer="count",
        balance_alpha=1.3, balance_fixed=2.0, run_dir="", metrics_port=None,
    )  # fmt: skip
    changed = set()
    for config in (cached, pipelined, planned, sequences):
        args = build_parser().parse_args(["train", *train_argv(config)])
        assert config_from_args(args, list(config.endpoints)) == config
        defaults = TrainConfig(endpoints=config.endpoints)
        changed |= {
            f.name
            for f in dataclasses.fields(config)
            if f.name != "client" and getattr(config, f.name) != getattr(defaults, f.name)
        }
        changed |= {
            f"client.{f.name}"
            for f in dataclasses.fields(ClientConfig)
            if getattr(config.client, f.name) != getattr(defaults.client, f.name)
        }
    every_setting = {f.name for f in dataclasses.fields(TrainConfig)} - {"endpoints", "client"}
    every_setting |= {f"client.{f.name}" for f in dataclasses.fields(ClientConfig)}
    assert changed == every_setting


@pytest.mark.parametrize(
    "change, message",
    [
        ({"cache": "fifo"}, "cache must be one of none, replicated, static, lru, lfu"),
        ({"pull_bound": -1}, "pull_bound and push_bound must be >= 0"),
        ({"steps": 0}, "steps must be >= 1"),
        ({"endpoints": ()}, "endpoints must list"),
        ({"device": "tpu"}, "device must be auto, cpu, cuda or cuda:N, got 'tpu'"),
        ({"device": "cuda:x"}, "device must be auto, cpu, cuda or cuda:N"),
        ({"heldout_every": 1}, "heldout_every must be >= 2"),
        ({"staleness": -1}, "staleness must be in 0..64"),
        ({"staleness": 65}, "staleness must be in 0..64"),
        ({"update_mode": "async"}, "update mode async needs staleness >= 1"),
        ({"torch_threads": -1}, "torch_threads must be >= 0"),
        ({"flush_every": -1}, "flush_every must be >= 0"),
        ({"cache": "lru", "staleness": 1}, "cache 'lru' on data_path 'auto' bounds staleness"),
        ({"data_path": "serial", "staleness": 1}, "staleness and update_mode belong to the clock"),
        ({"update_mode": "eventual"}, "update_mode must be one of exact, async"),
        ({"data_path": "fast"}, "data_path must be one of auto, pipeline, serial"),
        ({"cache": "replicated", "data_path": "serial"}, "cache replicated needs data_path"),
        ({"wire_dtype": "float8"}, "row dtype must be one of float32, float16, bfloat16"),
        ({"cache": "lru", "wire_dtype": "bfloat16"}, "cache 'lru' on data_path 'auto' pulls and"),
    ],
)
def test_invalid_train_configs_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TrainConfig(endpoints=("a:1",)), **change).validate()


def test_devices_resolve_and_the_process_group_follows_them(monkeypatch):
    from ember.trainer.config import process_group_backend, resolve_device

    assert process_group_backend(torch.device("cuda", 1)) == "nccl"
    assert process_group_backend(torch.device("cpu")) == "gloo"
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="torch sees no GPU.*use --device cpu"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resolve_device("auto") == torch.device("cuda", 1)  # one GPU per torchrun rank
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(ValueError, match="cuda:2, but torch sees 2 GPU"):
        resolve_device("cuda:2")


@pytest.mark.parametrize(
    "change",
    [{"cache": "lru"}, {"cache": "static"}, {"cache": "none", "data_path": "serial"}],
    ids=["lru", "static", "serial"],
)
def test_ucx_is_refused_where_rows_travel_by_pull_and_push(change):
    ucx = ClientConfig(transport="ucx")
    config = TrainConfig(endpoints=("127.0.0.1:1",), client=ucx, **change)
    with pytest.raises(ValueError, match="transport ucx carries the step calls only"):
        config.validate()
    TrainConfig(endpoints=("127.0.0.1:1",), client=ucx, cache="replicated").validate()
