"""DLRM: bottom MLP over dense features, pairwise dot interaction, top MLP."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import nn


def _mlp(sizes: Sequence[int], last_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(fan_in, fan_out))
        if last_activation or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """The dense part of DLRM; the embeddings come from outside (the PS or a reference).

    Args:
        num_dense: dense input features.
        num_sparse: embedded sparse features.
        dim: embedding width (the bottom MLP's output width).
        bottom: hidden widths of the bottom MLP.
        top: hidden widths of the top MLP (a final width-1 layer is added).

    Example:
        >>> model = DLRM(num_dense=13, num_sparse=26, dim=16)
        >>> model(torch.randn(4, 13), torch.randn(4, 26, 16)).shape
        torch.Size([4])
    """

    def __init__(
        self,
        num_dense: int,
        num_sparse: int,
        dim: int,
        bottom: Sequence[int] = (64, 32),
        top: Sequence[int] = (64, 32),
    ) -> None:
        super().__init__()
        self.bottom = _mlp([num_dense, *bottom, dim], last_activation=True)
        pairs = (num_sparse + 1) * num_sparse // 2
        self.top = _mlp([dim + pairs, *top, 1], last_activation=False)
        rows, cols = torch.triu_indices(num_sparse + 1, num_sparse + 1, offset=1)
        self.register_buffer("_rows", rows, persistent=False)
        self.register_buffer("_cols", cols, persistent=False)

    def forward(self, dense: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        """Logits [batch] from dense [batch, num_dense] and embeddings [batch, num_sparse, dim]."""
        x = self.bottom(dense)
        z = torch.cat([x.unsqueeze(1), embeddings], dim=1)
        dots = torch.bmm(z, z.transpose(1, 2))[:, self._rows, self._cols]
        return self.top(torch.cat([x, dots], dim=1)).squeeze(1)
