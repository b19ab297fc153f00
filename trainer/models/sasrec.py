"""SASRec: causal self-attention over a user's item history, for next-item retrieval.

As with DLRM, the embeddings come from outside (the PS or a reference table).
Histories are jagged; samples are grouped into power-of-two length buckets and
padded only within a bucket, so compute follows the real lengths (the load
balancer's per-sample cost model). Padding goes after the last item and
attention is causal, so padding never reaches a real position: every bucketing
gives the same result.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class _Block(nn.Module):
    """Pre-norm causal self-attention and a position-wise feed-forward, both residual."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.attention_norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.feed_forward_norm = nn.LayerNorm(dim)
        self.feed_forward = nn.Sequential(
            nn.Linear(dim, dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(dim, dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        q, k, v = self.qkv(self.attention_norm(x)).chunk(3, dim=-1)
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        dropout = self.dropout if self.training else 0.0
        attended = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        x = x + F.dropout(
            self.out(attended.transpose(1, 2).reshape(batch, length, dim)), dropout, self.training
        )
        return x + F.dropout(self.feed_forward(self.feed_forward_norm(x)), dropout, self.training)


class SASRec(nn.Module):
    """The dense part of SASRec: history rows and user rows in, one representation out.

    Positions count back from the most recent item (position 0 is the last item),
    so truncating old items never shifts them. The representation is the output
    at the most recent position, concatenated with the user row and projected.

    Args:
        dim: embedding width of the item and user rows.
        max_len: the longest history accepted (positions learned).
        heads: attention heads; must divide ``dim``.
        layers: attention blocks.
        dropout: dropout of the input, the attention and the feed-forwards.

    Raises:
        ValueError: a size < 1, ``heads`` not dividing ``dim``, or ``dropout`` outside [0, 1).

    Example:
        >>> model = SASRec(dim=16, max_len=8)
        >>> offsets = torch.tensor([0, 3, 4])  # two samples: 3 items, then 1
        >>> model(torch.randn(4, 16), offsets, torch.randn(2, 16)).shape
        torch.Size([2, 16])
    """

    def __init__(
        self, dim: int, max_len: int, heads: int = 2, layers: int = 2, dropout: float = 0.1
    ) -> None:
        super().__init__()
        sizes = {"dim": dim, "max_len": max_len, "heads": heads, "layers": layers}
        for name, value in sizes.items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if dim % heads:
            raise ValueError(f"heads must divide dim, got dim={dim} and heads={heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.dim = dim
        self.max_len = max_len
        self.positions = nn.Embedding(max_len, dim)
        nn.init.normal_(self.positions.weight, std=dim**-0.5)
        self.input_dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(_Block(dim, heads, dropout) for _ in range(layers))
        self.final_norm = nn.LayerNorm(dim)
        self.combine = nn.Linear(2 * dim, dim)

    def forward(
        self, history_rows: torch.Tensor, offsets: torch.Tensor, user_rows: torch.Tensor
    ) -> torch.Tensor:
        """Representations [batch, dim] of the samples, in their order.

        Args:
            history_rows: [nnz, dim] rows of every history item, sample after sample, oldest
                first within a sample (the layout of ``SequenceBatch.history``).
            offsets: int64 [batch + 1]; sample b owns ``history_rows[offsets[b]:offsets[b+1]]``.
            user_rows: [batch, dim] the row of each sample's user.

        Raises:
            ValueError: shapes that disagree, or a history empty or longer than ``max_len``.
        """
        offsets = self._check(history_rows, offsets, user_rows)
        lengths = offsets.diff()
        sequence = history_rows.new_empty(len(lengths), self.dim)
        widths = bucket_widths(lengths, self.max_len)
        for width in torch.unique(widths).tolist():
            members = torch.nonzero(widths == width).squeeze(1)
            encoded = self._encode(history_rows, offsets[members], lengths[members], width)
            sequence = sequence.index_copy(0, members.to(sequence.device), encoded)
        return self.combine(torch.cat([sequence, user_rows], dim=1))

    @staticmethod
    def score(representation: torch.Tensor, candidate_rows: torch.Tensor) -> torch.Tensor:
        """Scores [batch, candidates]: dot products of [batch, dim] representations with
        [batch, candidates, dim] candidate item rows."""
        return torch.bmm(candidate_rows, representation.unsqueeze(2)).squeeze(2)

    def _encode(
        self, rows: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, width: int
    ) -> torch.Tensor:
        columns = torch.arange(width)
        real = columns[None, :] < lengths[:, None]
        # Padding repeats row 0: causal attention keeps it away from every real position.
        x = rows[torch.where(real, starts[:, None] + columns[None, :], 0).to(rows.device)]
        positions = (lengths[:, None] - 1 - columns[None, :]).clamp(min=0).to(rows.device)
        x = self.input_dropout(x + self.positions(positions))
        for block in self.blocks:
            x = block(x)
        last = (lengths - 1).to(rows.device)
        return self.final_norm(x[torch.arange(len(lengths), device=rows.device), last])

    def _check(
        self, history_rows: torch.Tensor, offsets: torch.Tensor, user_rows: torch.Tensor
    ) -> torch.Tensor:
        if history_rows.dim() != 2 or history_rows.shape[1] != self.dim:
            raise ValueError(
                f"history_rows must be [nnz, {self.dim}], got {tuple(history_rows.shape)}"
            )
        if user_rows.dim() != 2 or user_rows.shape[1] != self.dim:
            raise ValueError(f"user_rows must be [batch, {self.dim}], got {tuple(user_rows.shape)}")
        offsets = offsets.cpu()
        if offsets.shape != (len(user_rows) + 1,):
            raise ValueError(
                f"offsets must have batch + 1 = {len(user_rows) + 1} entries, got {len(offsets)}"
            )
        if int(offsets[0]) != 0 or int(offsets[-1]) != len(history_rows):
            raise ValueError(
                f"offsets must run from 0 to nnz={len(history_rows)}, "
                f"got {int(offsets[0])} to {int(offsets[-1])}"
            )
        lengths = offsets.diff()
        if len(lengths) and not 1 <= int(lengths.min()) <= int(lengths.max()) <= self.max_len:
            raise ValueError(
                f"history lengths must be in [1, max_len={self.max_len}], "
                f"got {int(lengths.min())} to {int(lengths.max())}"
            )
        return offsets


def bucket_widths(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """The width each sample is padded to: the power of two at or above its length, at
    most ``max_len`` (what a sample costs the model, whatever else is in its batch)."""
    widths = torch.pow(2, torch.ceil(torch.log2(lengths.double()))).to(torch.int64)
    return widths.clamp(max=max_len)


def sampled_softmax_loss(scores: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of [batch, 1 + negatives] scores whose column 0 is the positive.

    Raises:
        ValueError: ``scores`` not 2-D with >= 2 columns.
    """
    if scores.dim() != 2 or scores.shape[1] < 2:
        raise ValueError(f"scores must be [batch, 1 + negatives >= 2], got {tuple(scores.shape)}")
    target = torch.zeros(len(scores), dtype=torch.int64, device=scores.device)
    return F.cross_entropy(scores, target)


def hit_rate_ndcg_at_k(scores: torch.Tensor, k: int = 10) -> tuple[float, float]:
    """HR@k and NDCG@k of [batch, candidates] scores whose column 0 is the positive.

    The positive's rank counts the negatives scored at least as high, so a tie
    counts against the model (constant scores never look good).

    Returns:
        ``(hit_rate, ndcg)``, means over the batch.

    Raises:
        ValueError: ``k`` < 1, or ``scores`` not 2-D with a row and >= 2 columns.

    Example:
        >>> hit_rate_ndcg_at_k(torch.tensor([[3.0, 1.0, 2.0], [1.0, 2.0, 3.0]]), k=2)
        (0.5, 0.5)
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if scores.dim() != 2 or scores.shape[0] < 1 or scores.shape[1] < 2:
        raise ValueError(f"scores must be [batch >= 1, candidates >= 2], got {tuple(scores.shape)}")
    rank = (scores[:, 1:] >= scores[:, :1]).sum(dim=1).double()
    hit = rank < k
    ndcg = torch.where(hit, 1.0 / torch.log2(rank + 2.0), 0.0)
    return float(hit.double().mean()), float(ndcg.mean())


def sample_negatives(
    generator: torch.Generator,
    batch_size: int,
    count: int,
    num_items: int,
    exclude: torch.Tensor | None = None,
) -> torch.Tensor:
    """int64 [batch_size, count] item ids, uniform over the items other than the row's positive.

    Args:
        generator: a CPU generator; the draws are a pure function of its state.
        batch_size: samples.
        count: negatives per sample.
        num_items: items are ``[0, num_items)``.
        exclude: int64 [batch_size] each sample's positive, never drawn for its row; None
            draws from every item.

    Raises:
        ValueError: a size < 1, ``num_items`` < 2, or ``exclude`` not [batch_size] item ids.

    Example:
        >>> positives = torch.tensor([0, 2])
        >>> negatives = sample_negatives(torch.Generator().manual_seed(0), 2, 5, 3, positives)
        >>> bool((negatives != positives[:, None]).all())
        True
    """
    for name, value in (("batch_size", batch_size), ("count", count)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if num_items < 2:
        raise ValueError(f"num_items must be >= 2 to leave a negative, got {num_items}")
    if exclude is None:
        return torch.randint(0, num_items, (batch_size, count), generator=generator)
    exclude = exclude.cpu().to(torch.int64)
    if exclude.shape != (batch_size,):
        raise ValueError(f"exclude must be [{batch_size}], got {tuple(exclude.shape)}")
    if not 0 <= int(exclude.min()) <= int(exclude.max()) < num_items:
        low, high = int(exclude.min()), int(exclude.max())
        raise ValueError(f"exclude must hold item ids in [0, {num_items}), got {low} to {high}")
    # One draw from the num_items - 1 other ids, stepping over the positive: exactly
    # uniform, as resampling collisions would be, without a data-dependent loop.
    draws = torch.randint(0, num_items - 1, (batch_size, count), generator=generator)
    return draws + (draws >= exclude[:, None]).to(torch.int64)
