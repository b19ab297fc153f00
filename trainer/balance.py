"""Load-balanced assignment of a global batch's samples to ranks (as in FreeScale).

A sequence sample costs about ``a + b * length**alpha`` seconds to train, so
equal sample counts per rank leave the rank holding the long histories to
hold up every other rank at the step's collectives. Policies:

* ``none``: contiguous, equal-count chunks in arrival order (a plain loader).
* ``count``: samples sorted by length (descending, stable) and dealt in zig-zag
  order 0, 1, .., W-1, W-1, .., 0, 0, 1, ..: equal counts (within one), similar mix.
* ``cost``: longest-processing-time greedy on :class:`SampleCost` (``fixed +
  scale * length**alpha``): samples sorted by cost (descending, stable), each to the
  rank with the least cost so far (ties to the lowest rank): near-equal cost,
  unequal counts.

Every policy is a pure function of the lengths, so every rank computes the
same assignment locally with no communication. Each rank's indices are in
arrival order. With at least as many samples as ranks every rank gets one
(the first W samples of every policy go to distinct ranks); with fewer, some
get none. Since counts differ, average the loss over the global batch (sum of
per-sample losses / G), not as a mean of per-rank means.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Sequence

import numpy as np
import torch

BALANCERS = ("none", "count", "cost")
_ALPHA_GRID = np.linspace(0.25, 3.0, 276)  # steps of 0.01


@dataclasses.dataclass(frozen=True)
class SampleCost:
    """A sample of length L costs ``fixed + scale * L**alpha``: ``fixed`` is the per-sample
    work that does not grow with L (scale 0: every sample costs the same, as ``count``
    assumes). Units are arbitrary (seconds when calibrated)."""

    alpha: float = 1.0
    fixed: float = 0.0
    scale: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.alpha) and self.alpha > 0):
            raise ValueError(f"alpha must be finite and > 0, got {self.alpha}")
        for name in ("fixed", "scale"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"the {name} cost must be finite and >= 0, got {value}")
        if self.fixed == 0 and self.scale == 0:
            raise ValueError("a sample cost needs a fixed or a length part above 0")

    def of(self, lengths: torch.Tensor) -> np.ndarray:
        """float64 cost of each length."""
        lengths = lengths.cpu().numpy().astype(np.float64)
        return self.fixed + self.scale * lengths**self.alpha


def assign(
    lengths: torch.Tensor, world: int, policy: str, cost: SampleCost = SampleCost()
) -> list[torch.Tensor]:
    """Split the samples of a global batch among ``world`` ranks.

    Args:
        lengths: int64 [G] history length of each sample (>= 1).
        world: number of ranks.
        policy: one of :data:`BALANCERS` (see the module docstring).
        cost: what a sample costs (used by ``cost``).

    Returns:
        One int64 tensor per rank of indices into the global batch, in arrival order;
        together a partition of ``range(G)``.

    Raises:
        ValueError: an unknown policy, ``world`` < 1, or ``lengths`` not a 1-D integer
            tensor of values >= 1.

    Example:
        >>> [r.tolist() for r in assign(torch.tensor([1, 5, 2, 4, 3, 6]), 2, "count")]
        [[2, 4, 5], [0, 1, 3]]
    """
    if policy not in BALANCERS:
        raise ValueError(f"policy must be one of {', '.join(BALANCERS)}, got {policy!r}")
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    if lengths.dim() != 1 or lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise ValueError(
            f"lengths must be a 1-D integer tensor, got {lengths.dtype} of shape "
            f"{tuple(lengths.shape)}"
        )
    lengths = lengths.cpu().to(torch.int64)
    if len(lengths) and int(lengths.min()) < 1:
        empty = int(torch.nonzero(lengths < 1)[0])
        raise ValueError(f"every length must be >= 1, sample {empty} has {int(lengths[empty])}")
    if policy == "none":
        return [chunk.clone() for chunk in torch.arange(len(lengths)).tensor_split(world)]
    order = torch.argsort(lengths, descending=True, stable=True)
    if policy == "count":
        position = torch.arange(len(lengths))
        lap, seat = position // world, position % world
        ranks_in_order = torch.where(lap % 2 == 0, seat, world - 1 - seat)
    else:
        ranks_in_order = torch.from_numpy(_greedy(cost.of(lengths[order]), world))
    ranks = torch.empty_like(order).index_put_((order,), ranks_in_order)
    return [torch.nonzero(ranks == rank).squeeze(1) for rank in range(world)]


def predicted_costs(
    lengths: torch.Tensor, assignment: Sequence[torch.Tensor], cost: SampleCost
) -> list[float]:
    """Predicted cost of each rank's share: the sum of its samples' costs."""
    costs = cost.of(lengths)
    return [float(costs[share.cpu().numpy()].sum()) for share in assignment]


def straggler_ratio(seconds_per_rank: Sequence[float]) -> float:
    """The slowest rank's time over the mean: 1.0 is perfect balance.

    Raises:
        ValueError: no rank, a negative or non-finite time, or a mean of 0.
    """
    seconds = np.asarray(seconds_per_rank, dtype=np.float64)
    if seconds.ndim != 1 or len(seconds) == 0:
        raise ValueError("seconds_per_rank must hold one time per rank, got none")
    if not np.isfinite(seconds).all() or float(seconds.min()) < 0.0:
        raise ValueError(f"times must be finite and >= 0, got {seconds.tolist()}")
    mean = float(seconds.mean())
    if mean <= 0.0:
        raise ValueError(f"the mean time must be > 0, got {mean}")
    return float(seconds.max()) / mean


def calibrate_cost(lengths: Sequence[float], seconds: Sequence[float]) -> SampleCost:
    """The cost of the best fit ``seconds ~ a + b * length**alpha`` with ``a, b >= 0``:
    ``SampleCost(alpha, a, b)``, in seconds.

    A grid search over alpha in [0.25, 3] in steps of 0.01, with non-negative least
    squares for ``a`` and ``b`` at each alpha.

    Args:
        lengths: the length of each measurement (> 0).
        seconds: its measured time (> 0), one per length.

    Returns:
        The best alpha on the grid with its ``a`` and ``b``. Times that do not grow with
        length (``b`` = 0 at every alpha) give a cost that is the same for every sample
        (alpha 1, scale 0): the balancer then splits by count.

    Raises:
        ValueError: unequal or non-1-D inputs, fewer than 3 distinct lengths, or a length
            or time not finite and > 0.

    Example:
        >>> cost = calibrate_cost([1, 2, 4, 8], [0.1 + 0.02 * n**1.5 for n in [1, 2, 4, 8]])
        >>> round(cost.alpha, 2), round(cost.fixed, 3), round(cost.scale, 3)
        (1.5, 0.1, 0.02)
    """
    x = np.asarray(lengths, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(
            f"lengths and seconds must be 1-D of one size, got {x.shape} and {y.shape}"
        )
    for name, values in (("lengths", x), ("seconds", y)):
        if not (np.isfinite(values).all() and (values > 0).all()):
            raise ValueError(f"{name} must be finite and > 0, got {values.tolist()}")
    if len(np.unique(x)) < 3:
        raise ValueError(f"need >= 3 distinct lengths to fit alpha, got {sorted(set(x.tolist()))}")
    # Lengths scaled to at most 1 keep length**3 well conditioned; b absorbs the scale.
    features = (x / x.max())[None, :] ** _ALPHA_GRID[:, None]
    fits = [_nonnegative_fit(f, y) for f in features]
    best = int(np.argmin([error for error, _, _ in fits]))
    _, a, b = fits[best]
    if b <= 0:
        return SampleCost(1.0, fixed=float(y.mean()), scale=0.0)
    alpha = float(_ALPHA_GRID[best])
    return SampleCost(alpha, fixed=float(a), scale=float(b / x.max() ** alpha))


def _nonnegative_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """``(squared error, a, b)`` of the least-squares fit y ~ a + b x with a, b >= 0."""
    x_mean, y_mean = x.mean(), y.mean()
    spread = float(((x - x_mean) ** 2).sum())
    b = float(((x - x_mean) * (y - y_mean)).sum()) / spread if spread > 0 else -1.0
    fits = [(y_mean - b * x_mean, b)]
    if b < 0 or fits[0][0] < 0:
        # The convex optimum then lies on an edge: a = 0 or b = 0.
        fits = [(float(y_mean), 0.0), (0.0, float((x * y).sum() / (x * x).sum()))]
    return min((float(((a + b * x - y) ** 2).sum()), a, b) for a, b in fits)


def _greedy(costs: np.ndarray, world: int) -> np.ndarray:
    """Rank of each cost, taken in order, when each goes to the least-loaded rank."""
    loads = [(0.0, rank) for rank in range(world)]
    ranks = np.empty(len(costs), dtype=np.int64)
    for position, cost in enumerate(costs.tolist()):
        load, rank = heapq.heappop(loads)
        ranks[position] = rank
        heapq.heappush(loads, (load + cost, rank))
    return ranks
