"""Probes of a 2-rank exact-mode job whose rank 0 sent clock 0 and rank 1 did not: whether
a shard holds rank 0's update, and whether it has let it go (withdrawn)."""

from __future__ import annotations

import time

import pytest
import torch
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.client.step_client import StepClient
from ember.ps_server.client.step_job import StepJob
from ember.ps_server.errors import PSClientError


def _missing(endpoints: list[str], job: str, table: str, ids: torch.Tensor) -> str:
    """What a short lookup of clock 0 by rank 1 says is missing."""
    with PSClient(endpoints) as client:
        probe = StepClient(client, StepJob(job, world=2, rank=1, wait_s=0.2))
        with pytest.raises(PSClientError) as waited:
            probe.lookup({table: ids}, clock=0)
    return waited.value.details


def wait_until_held(endpoints: list[str], job: str, table: str, ids: torch.Tensor) -> None:
    """Until the shards hold rank 0's clock 0 (only rank 1 is then missing), for at most
    200 probes."""
    for _ in range(200):
        details = _missing(endpoints, job, table, ids)
        if "rank(s) 1 have not delivered clock 0" in details:
            return
    raise AssertionError(f"the shard never held rank 0's update: {details}")


def wait_until_withdrawn(
    endpoints: list[str], job: str, table: str, ids: torch.Tensor, within_s: float
) -> None:
    """Until rank 0's clock 0 is no longer held (both ranks are then missing), for at most
    ``within_s``."""
    started = time.monotonic()
    while time.monotonic() - started < within_s:
        details = _missing(endpoints, job, table, ids)
        if "rank(s) 0, 1 have not delivered clock 0" in details:
            return
    raise AssertionError(f"rank 0's update stayed held for {within_s} s: {details}")
