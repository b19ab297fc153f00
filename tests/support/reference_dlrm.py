"""A single-process reference: DLRM with nn.EmbeddingBag tables and torch optimizers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from ember.ps_server.shard.initializers import initial_rows
from ember.ps_server.wire.table_spec import OptimizerKind, TableSpec
from ember.trainer.data.batch import JaggedIds
from torch import nn


class ReferenceEmbeddings(nn.Module):
    """One nn.EmbeddingBag per table, initialised exactly as the PS initialises rows."""

    def __init__(self, specs: Sequence[TableSpec], cardinalities: Sequence[int]) -> None:
        super().__init__()
        self.bags = nn.ModuleList()
        for spec, cardinality in zip(specs, cardinalities):
            bag = nn.EmbeddingBag(
                cardinality, spec.dim, mode="sum", sparse=True, include_last_offset=True
            )
            with torch.no_grad():
                bag.weight.copy_(initial_rows(spec, np.arange(cardinality, dtype=np.int64)))
            self.bags.append(bag)

    def forward(self, features: Sequence[JaggedIds]) -> torch.Tensor:
        return torch.stack([bag(f.values, f.offsets) for bag, f in zip(self.bags, features)], dim=1)


def sparse_optimizer(spec: TableSpec, parameters) -> torch.optim.Optimizer:
    """The torch optimizer whose sparse update equals the shard's for ``spec``."""
    opt = spec.optimizer
    if opt.kind is OptimizerKind.SGD:
        return torch.optim.SGD(parameters, lr=opt.lr)
    if opt.kind is OptimizerKind.ADAGRAD:
        return torch.optim.Adagrad(
            parameters, lr=opt.lr, eps=opt.eps, initial_accumulator_value=0.0
        )
    raise ValueError(f"no sparse torch reference for {opt.kind}")
