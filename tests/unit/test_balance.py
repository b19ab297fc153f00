"""Assignment of a global batch to ranks: partitions, the policies' rules, calibration."""

import numpy as np
import pytest
import torch
from ember.trainer.balance import (
    BALANCERS,
    SampleCost,
    assign,
    calibrate_cost,
    predicted_costs,
    straggler_ratio,
)
from hypothesis import given, settings
from hypothesis import strategies as st


def _shares(lengths: list[int], world: int, policy: str, alpha: float = 1.0) -> list[list[int]]:
    shares = assign(torch.tensor(lengths, dtype=torch.int64), world, policy, SampleCost(alpha))
    return [share.tolist() for share in shares]


def _heavy_tailed(count: int, seed: int = 0) -> torch.Tensor:
    lengths = np.random.default_rng(seed).lognormal(np.log(8.0), 1.0, count)
    return torch.from_numpy(np.clip(np.rint(lengths), 1, 50).astype(np.int64))


def _imbalance(lengths: torch.Tensor, world: int, policy: str, alpha: float) -> float:
    cost = SampleCost(alpha)
    return straggler_ratio(predicted_costs(lengths, assign(lengths, world, policy, cost), cost))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 200), max_size=60),
    st.integers(1, 8),
    st.sampled_from(BALANCERS),
    st.floats(0.1, 3.0),
)
def test_every_policy_splits_the_batch_exactly_and_deterministically(lengths, world, policy, alpha):
    shares = _shares(lengths, world, policy, alpha)
    assert len(shares) == world
    assert sorted(i for share in shares for i in share) == list(range(len(lengths)))
    assert all(share == sorted(share) for share in shares)
    assert shares == _shares(lengths, world, policy, alpha)
    if policy != "cost":
        counts = [len(share) for share in shares]
        assert max(counts) - min(counts) <= 1


def test_none_deals_contiguous_chunks_in_arrival_order():
    assert _shares([9, 1, 1, 1, 1, 1, 1], 3, "none") == [[0, 1, 2], [3, 4], [5, 6]]


def test_count_deals_the_longest_first_in_zig_zag_order_ties_by_arrival():
    # Sorted: 6 (9), 0 (8), 1 (7), ..., 5 (3); seats 0, 1, 2, 2, 1, 0, 0.
    assert _shares([8, 7, 6, 5, 4, 3, 9], 3, "count") == [[4, 5, 6], [0, 3], [1, 2]]
    # Ties keep arrival order: 1, 0, 2, 3 take seats 0, 1, 1, 0.
    assert _shares([5, 9, 5, 5], 2, "count") == [[1, 3], [0, 2]]


def test_cost_gives_each_sample_to_the_least_loaded_rank_ties_to_the_lowest():
    # 5 -> r0 (5); 4 -> r1 (4); 3 -> r1 (7); 3 -> r0 (8); 3 -> r1 (10).
    assert _shares([3, 5, 3, 4, 3], 2, "cost") == [[1, 2], [0, 3, 4]]
    assert _shares([1, 1, 1, 1], 2, "cost") == [[0, 2], [1, 3]]
    # With alpha 2 the one long sample outweighs the three short ones together.
    assert _shares([4, 2, 2, 2], 2, "cost", alpha=2.0) == [[0], [1, 2, 3]]


def test_fewer_samples_than_ranks_leaves_some_ranks_empty():
    for policy in BALANCERS:
        shares = _shares([3, 7], 4, policy)
        assert sorted(i for s in shares for i in s) == [0, 1] and shares.count([]) == 2
    assert _shares([], 2, "cost") == [[], []]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("alpha", [1.0, 1.5])
def test_cost_balances_heavy_tailed_lengths_where_arrival_order_does_not(world, alpha):
    # 32 samples per rank, as long histories leave room for; 20 global batches.
    batches = [_heavy_tailed(32 * world, seed) for seed in range(20)]
    assert max(_imbalance(lengths, world, "cost", alpha) for lengths in batches) <= 1.02
    assert np.mean([_imbalance(lengths, world, "none", alpha) for lengths in batches]) > 1.08
    for lengths in batches[:3]:
        assert [len(share) for share in assign(lengths, world, "count")] == [32] * world


def test_predicted_costs_sum_length_to_the_alpha():
    lengths = torch.tensor([1, 2, 3, 4])
    shares = [torch.tensor([0, 3]), torch.tensor([1, 2])]
    assert predicted_costs(lengths, shares, SampleCost(2.0)) == [17.0, 13.0]
    assert predicted_costs(lengths, shares, SampleCost(2.0, fixed=1.0)) == [19.0, 15.0]
    assert predicted_costs(lengths, shares, SampleCost(2.0, fixed=1.0, scale=0.0)) == [2.0, 2.0]


def test_the_fixed_cost_moves_short_samples_off_the_rank_holding_many():
    """One long sample against many short ones: without the per-sample part the short
    ones pile onto one rank."""
    lengths = torch.tensor([64] + [1] * 40)
    cost = SampleCost(1.0, fixed=2.0)
    balanced = predicted_costs(lengths, assign(lengths, 2, "cost", cost), cost)
    naive = predicted_costs(lengths, assign(lengths, 2, "cost", SampleCost(1.0)), cost)
    assert straggler_ratio(balanced) < 1.05 < straggler_ratio(naive)


@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0])
def test_calibration_recovers_alpha_from_noisy_timings(alpha):
    rng = np.random.default_rng(int(alpha * 10))
    lengths = rng.integers(1, 65, 200).astype(np.float64)
    seconds = (2e-3 + 1e-5 * lengths**alpha) * rng.normal(1.0, 0.02, 200)
    cost = calibrate_cost(lengths.tolist(), seconds.tolist())
    assert abs(cost.alpha - alpha) <= 0.1
    assert cost.fixed == pytest.approx(2e-3, rel=0.2)
    assert cost.scale * 64**cost.alpha == pytest.approx(1e-5 * 64**alpha, rel=0.2)


def test_times_that_do_not_grow_with_length_split_by_count():
    cost = calibrate_cost([2, 4, 8, 16], [0.012, 0.011, 0.010, 0.009])  # falling: b = 0
    assert cost.scale == 0.0 and cost.fixed > 0
    lengths = torch.tensor([1, 2, 50, 3, 200, 4, 5, 6])
    assert [len(share) for share in assign(lengths, 2, "cost", cost)] == [4, 4]


def test_straggler_ratio_is_the_slowest_over_the_mean():
    assert straggler_ratio([1.0, 2.0, 3.0]) == pytest.approx(1.5)
    assert straggler_ratio([0.25]) == 1.0


def test_bad_arguments_are_refused():
    lengths = torch.tensor([2, 3])
    with pytest.raises(ValueError, match="policy must be one of none, count, cost, got 'fair'"):
        assign(lengths, 2, "fair")
    with pytest.raises(ValueError, match="world must be >= 1, got 0"):
        assign(lengths, 0, "none")
    for alpha in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="alpha must be finite and > 0"):
            SampleCost(alpha)
    with pytest.raises(ValueError, match="fixed cost must be finite and >= 0"):
        SampleCost(1.0, fixed=-1.0)
    with pytest.raises(ValueError, match="a fixed or a length part above 0"):
        SampleCost(1.0, fixed=0.0, scale=0.0)
    with pytest.raises(ValueError, match="every length must be >= 1, sample 1 has 0"):
        assign(torch.tensor([2, 0, 1]), 2, "count")
    with pytest.raises(ValueError, match="lengths must be a 1-D integer tensor"):
        assign(torch.tensor([[2, 3]]), 2, "count")
    with pytest.raises(ValueError, match="lengths must be a 1-D integer tensor"):
        assign(torch.tensor([2.0, 3.0]), 2, "count")
    with pytest.raises(
        ValueError, match=r"need >= 3 distinct lengths to fit alpha, got \[1.0, 2.0\]"
    ):
        calibrate_cost([1, 2, 2, 1], [0.1, 0.2, 0.2, 0.1])
    with pytest.raises(ValueError, match="seconds must be finite and > 0"):
        calibrate_cost([1, 2, 3], [0.1, 0.0, 0.3])
    with pytest.raises(ValueError, match="lengths and seconds must be 1-D of one size"):
        calibrate_cost([1, 2, 3], [0.1, 0.2])
    with pytest.raises(ValueError, match="seconds_per_rank must hold one time per rank, got none"):
        straggler_ratio([])
    with pytest.raises(ValueError, match=r"the mean time must be > 0, got 0\.0"):
        straggler_ratio([0.0, 0.0])
