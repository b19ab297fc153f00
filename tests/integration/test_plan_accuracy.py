"""The traffic model against a real training run's own counters (hit rate, bytes)."""

import os
import threading

import pytest
from ember.trainer.cache.replicated_source import ReplicatedRowSource
from ember.trainer.config import TrainConfig
from ember.trainer.plan.apply import workload_profiles
from ember.trainer.plan.traffic_model import TrafficModel, Workload
from ember.trainer.train import synthetic_data, table_specs, train


@pytest.mark.parametrize("staleness", [0, 1])
def test_predicted_hit_rate_and_row_bytes_match_the_run(
    cluster, table_name, staleness, monkeypatch
):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    planned_on, prefetch = [], ReplicatedRowSource.prefetch
    monkeypatch.setattr(
        ReplicatedRowSource, "prefetch",
        lambda *args: planned_on.append(threading.current_thread().name) or prefetch(*args),
    )  # fmt: skip
    config = TrainConfig(
        endpoints=tuple(cluster.endpoints), steps=25, batch_size=256, max_cardinality=5000,
        dim=8, eval_batches=1, progress=False, cache="replicated", cache_mb=0.05,
        staleness=staleness, profile_batches=8, table_prefix=table_name, torch_threads=1,
    )  # fmt: skip
    data = synthetic_data(config)
    names = [spec.name for spec in table_specs(config, data.num_features)]
    model = TrafficModel(
        workload_profiles(config, data, names, 1),
        Workload(
            config.dim,
            config.batch_size,
            state_floats=config.dim,
            steps=config.steps,
            flush_every=config.flush_every,
        ),
    )
    hot_rows = model.rows_for_budget(config.cache_mb * 2**20)  # adagrad: dim state floats
    predicted = model.traffic(hot_rows, staleness)
    report = train(config)
    # The clocked pipeline plans every later step beside the step before's compute.
    assert len(planned_on) == config.steps - 1
    assert all(name.startswith("ember-plan") for name in planned_on), set(planned_on)
    assert 0.2 < report["cache_hit_rate"] < 0.95  # a hot set that matters, not all or nothing
    assert predicted.hit_rate == pytest.approx(report["cache_hit_rate"], rel=0.05)
    per_sample = predicted.per_sample(config.batch_size)
    for category in ("pulled", "pushed"):
        assert per_sample[category] == pytest.approx(
            report[f"bytes_{category}_per_sample"], rel=0.08
        ), category
    written = predicted.writeback_rows * config.steps  # one write-back, at the end
    assert written == pytest.approx(report["replica_rows_written_back"], rel=0.1)
