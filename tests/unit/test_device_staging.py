"""Prefetched rows on the host stay as they are: staging them costs no copy (the CUDA path,
a side stream and an event, is checked on a GPU by benchmarks/gpu_check.py)."""

import torch
from ember.trainer.device_staging import DeviceStaging


def test_host_rows_are_handed_back_as_they_arrived():
    rows = {"a": torch.randn(5, 4), "b": torch.randn(3, 4)}
    staging = DeviceStaging("cpu")
    staged = staging.stage(rows)
    assert staged.ready is None
    taken = staging.take(staged)
    assert taken is rows and all(taken[t] is rows[t] for t in rows)


def test_no_rows_need_no_copy():
    staging = DeviceStaging("cpu")
    assert staging.take(staging.stage({})) == {}
