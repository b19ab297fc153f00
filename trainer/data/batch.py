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

    def one_id_per_bag(self) -> bool:
        """Whether every sample has exactly one id (true without samples), so that pooling it
        is a gather: offsets rising strictly from 0 to as many ids as bags."""
        offsets = self.offsets
        return (
            len(self.values) == self.batch_size
            and int(offsets[0]) == 0
            and int(offsets[-1]) == len(self.values)
            and bool((offsets[1:] > offsets[:-1]).all())  # compared, not subtracted
        )


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
