"""Clients pushing known gradient sequences from threads, and the float64 state they imply.

Each pusher owns a disjoint set of ids and pushes one gradient step to all of
them per request, so a row's version counts the steps applied to it and its
expected value is the float64 reference after that many steps, whatever the
interleaving with other pushers.
"""

from __future__ import annotations

import threading

import numpy as np
import torch
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.shard.initializers import initial_rows
from ember.ps_server.wire.table_spec import TableSpec

from tests.support.reference import ReferenceRow

# Retries long enough to outlast a shard restart (process start plus replay).
PATIENT = ClientConfig(max_attempts=400, initial_backoff_s=0.05, max_backoff_s=0.25)


def step_grads(seed: int, step: int, rows: int, dim: int) -> np.ndarray:
    """The gradients pusher ``seed`` sends at ``step``."""
    generator = np.random.default_rng(seed * 100_003 + step)
    return generator.standard_normal((rows, dim)).astype(np.float32)


def expected_rows(spec: TableSpec, ids: np.ndarray, seed: int, steps: int) -> np.ndarray:
    """Float64 rows of ``ids`` after the first ``steps`` steps of pusher ``seed``."""
    start = initial_rows(spec, ids).numpy()
    rows = [ReferenceRow(start[k], spec.optimizer) for k in range(len(ids))]
    for step in range(steps):
        grads = step_grads(seed, step, len(ids), spec.dim)
        for k, row in enumerate(rows):
            row.apply(grads[k])
    return np.stack([row.w for row in rows])


class StepPusher(threading.Thread):
    """Pushes ``steps`` gradient steps for ``ids`` of ``spec``'s table, counting acknowledgements.

    ``reached(n)`` is an event set once ``n`` steps are acknowledged.
    """

    def __init__(
        self, endpoints: list[str], spec: TableSpec, ids: np.ndarray, seed: int, steps: int
    ) -> None:
        super().__init__(name=f"pusher-{seed}", daemon=True)
        self.endpoints, self.spec, self.ids, self.seed, self.steps = (
            endpoints, spec, ids, seed, steps,
        )  # fmt: skip
        self.acknowledged = 0
        self.error: BaseException | None = None
        self._events: dict[int, threading.Event] = {}
        self._lock = threading.Lock()

    def reached(self, steps: int) -> threading.Event:
        with self._lock:
            event = self._events.setdefault(steps, threading.Event())
            if self.acknowledged >= steps:
                event.set()
            return event

    def run(self) -> None:
        try:
            with PSClient(self.endpoints, PATIENT) as client:
                for step in range(self.steps):
                    grads = step_grads(self.seed, step, len(self.ids), self.spec.dim)
                    client.push(self.spec.name, torch.from_numpy(self.ids), torch.from_numpy(grads))
                    with self._lock:
                        self.acknowledged = step + 1
                        if step + 1 in self._events:
                            self._events[step + 1].set()
        except BaseException as error:  # noqa: BLE001 - reported to the test through .error
            self.error = error
        finally:
            with self._lock:  # release waiters on a failed run too
                for event in self._events.values():
                    event.set()
