"""The training batch: dense features, jagged sparse ids per feature, labels."""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class JaggedIds:
    """The ids of one sparse feature for a batch: sample b owns values[offsets[b]:offsets[b+1]].

    Attributes:
        values: int64 [nnz] ids.
        offsets: int64 [batch + 1], non-decreasing, offsets[0] == 0, offsets[-1] == nnz.
    """

    values: torch.Tensor
    offsets: torch.Tensor

    @property
    def batch_size(self) -> int:
        """Number of samples."""
        return len(self.offsets) - 1

    def smallest_bag(self) -> int:
        """The fewest ids any sample has (0 without samples; negative if offsets fall)."""
        return int(self.offsets.diff().min()) if len(self.offsets) > 1 else 0

    def one_id_per_bag(self, smallest_bag: int | None = None) -> bool:
        """Whether every sample has exactly one id (``smallest_bag``: :meth:`smallest_bag`,
        if already known), so that pooling it is a gather."""
        smallest = self.smallest_bag() if smallest_bag is None else smallest_bag
        return smallest == 1 and len(self.values) == self.batch_size  # n ids in n bags, none empty


@dataclasses.dataclass
class Batch:
    """A batch of Criteo-style samples.

    Attributes:
        dense: float32 [batch, num_dense].
        sparse: one JaggedIds per categorical feature.
        labels: float32 [batch], 0 or 1.
    """

    dense: torch.Tensor
    sparse: list[JaggedIds]
    labels: torch.Tensor

    @property
    def batch_size(self) -> int:
        """Number of samples."""
        return len(self.labels)

    def to(self, device: torch.device) -> Batch:
        """This batch with its dense features and labels on ``device``. The sparse ids stay
        where they are: the embedding lookup routes them to the shards from the host."""
        return Batch(self.dense.to(device), self.sparse, self.labels.to(device))
