"""SASRec: bucketing equals a padded reference, positions count from the end, the metrics."""

import math

import pytest
import torch
from ember.trainer.models.sasrec import (
    SASRec,
    hit_rate_ndcg_at_k,
    sample_negatives,
    sampled_softmax_loss,
)

DIM = 8


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _inputs(lengths: list[int], dtype=torch.float32, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    rows = torch.randn(sum(lengths), DIM, generator=generator, dtype=dtype)
    users = torch.randn(len(lengths), DIM, generator=generator, dtype=dtype)
    return rows, offsets, users


def _model(max_len: int = 16, **kwargs) -> SASRec:
    torch.manual_seed(0)
    return SASRec(DIM, max_len, **kwargs).double().eval()


def _padded_reference(model: SASRec, rows, offsets, users) -> torch.Tensor:
    """One batch padded to the longest history, positions counted back from each last item."""
    lengths = offsets.diff().tolist()
    width = max(lengths)
    x = rows.new_zeros(len(lengths), width, DIM)
    positions = torch.zeros(len(lengths), width, dtype=torch.int64)
    for b, length in enumerate(lengths):
        x[b, :length] = rows[offsets[b] : offsets[b + 1]]
        positions[b, :length] = torch.arange(length - 1, -1, -1)
    x = x + model.positions(positions)
    for block in model.blocks:
        x = block(x)
    last = model.final_norm(x[torch.arange(len(lengths)), torch.tensor(lengths) - 1])
    return model.combine(torch.cat([last, users], dim=1))


def test_the_bucketed_forward_equals_a_padded_reference_and_single_samples():
    lengths = [1, 2, 3, 4, 5, 7, 8, 9, 16, 13, 1, 6]
    model = _model()
    rows, offsets, users = _inputs(lengths, torch.float64)
    with torch.no_grad():
        out = model(rows, offsets, users)
        torch.testing.assert_close(out, _padded_reference(model, rows, offsets, users))
        for b, length in enumerate(lengths):
            alone = model(
                rows[offsets[b] : offsets[b + 1]], torch.tensor([0, length]), users[b : b + 1]
            )
            torch.testing.assert_close(out[b : b + 1], alone)
    assert out.shape == (len(lengths), DIM) and out.dtype == torch.float64


def test_reordering_the_samples_reorders_the_output():
    lengths = [5, 1, 12, 3, 8]
    model = _model()
    rows, offsets, users = _inputs(lengths, torch.float64)
    order = [3, 0, 4, 2, 1]
    segments = [rows[offsets[b] : offsets[b + 1]] for b in order]
    permuted_offsets = torch.tensor(
        [0, *torch.tensor([lengths[b] for b in order]).cumsum(0).tolist()]
    )
    with torch.no_grad():
        out = model(rows, offsets, users)
        permuted = model(torch.cat(segments), permuted_offsets, users[order])
    torch.testing.assert_close(permuted, out[order])


def test_positions_count_back_from_the_most_recent_item():
    model = _model(layers=1)
    seen = []
    model.input_dropout.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    rows, offsets, users = _inputs([3], torch.float64)
    with torch.no_grad():
        model(rows, offsets, users)
        expected = rows + model.positions.weight[[2, 1, 0]]
    assert seen[0].shape[1] == 4  # padded to its bucket's width, after the last item
    torch.testing.assert_close(seen[0][0][:3], expected)


def test_gradients_reach_every_history_row_and_every_user_row():
    model = SASRec(DIM, 8)
    rows, offsets, users = _inputs([4, 1, 7, 2])
    rows.requires_grad_(True)
    users.requires_grad_(True)
    model(rows, offsets, users).square().sum().backward()
    assert bool((rows.grad.abs().sum(dim=1) > 0).all())
    assert bool((users.grad.abs().sum(dim=1) > 0).all())


def test_score_is_the_dot_product_with_each_candidate():
    representation = torch.randn(3, DIM)
    candidates = torch.randn(3, 5, DIM)
    expected = torch.einsum("bd,bcd->bc", representation, candidates)
    torch.testing.assert_close(SASRec.score(representation, candidates), expected)


def test_the_sampled_softmax_loss_is_the_cross_entropy_of_column_zero():
    scores = torch.randn(4, 6, dtype=torch.float64)
    expected = -torch.log_softmax(scores, dim=1)[:, 0].mean()
    torch.testing.assert_close(sampled_softmax_loss(scores), expected)
    with pytest.raises(
        ValueError, match=r"scores must be \[batch, 1 \+ negatives >= 2\], got \(4,\)"
    ):
        sampled_softmax_loss(torch.randn(4))


def test_hit_rate_and_ndcg_on_a_hand_computed_example():
    # Ranks of the positive: 0, 2, 12 (out of range), and 1 with a tie counted against it.
    low = [-float(x) for x in range(1, 11)]
    scores = torch.tensor([
        [9.0, 1.0, 2.0, *low],
        [0.5, 6.0, 7.0, *low],
        [-20.0, 6.0, 7.0, *low],
        [3.0, 3.0, -0.5, *low],
    ])  # fmt: skip
    hit_rate, ndcg = hit_rate_ndcg_at_k(scores, k=10)
    assert hit_rate == pytest.approx(3 / 4)
    assert ndcg == pytest.approx((1.0 + 1.0 / math.log2(4) + 1.0 / math.log2(3)) / 4)
    assert hit_rate_ndcg_at_k(torch.zeros(2, 11), k=10) == (0.0, 0.0)


def test_negatives_are_uniform_over_the_other_items_and_reproducible():
    positives = torch.tensor([0, 3, 4])

    def draw() -> torch.Tensor:
        return sample_negatives(torch.Generator().manual_seed(7), 3, 2_000, 5, positives)

    negatives = draw()
    assert negatives.shape == (3, 2_000) and torch.equal(negatives, draw())
    for row, positive in zip(negatives, positives.tolist(), strict=True):
        counts = torch.bincount(row, minlength=5)
        assert int(counts[positive]) == 0
        others = counts[torch.arange(5) != positive].double()
        assert float(others.min()) > 400 and float(others.max()) < 600
    unrestricted = sample_negatives(torch.Generator().manual_seed(0), 2, 100, 3)
    assert set(unrestricted.unique().tolist()) == {0, 1, 2}


def test_bad_inputs_are_refused():
    model = SASRec(DIM, 4)
    rows, offsets, users = _inputs([2, 5])
    with pytest.raises(
        ValueError, match=r"history lengths must be in \[1, max_len=4\], got 2 to 5"
    ):
        model(rows, offsets, users)
    with pytest.raises(
        ValueError, match=r"history lengths must be in \[1, max_len=4\], got 0 to 2"
    ):
        model(rows[:2], torch.tensor([0, 2, 2]), users)
    with pytest.raises(ValueError, match="offsets must have batch \\+ 1 = 2 entries, got 3"):
        model(rows, offsets, users[:1])
    with pytest.raises(ValueError, match=r"history_rows must be \[nnz, 8\], got \(7, 4\)"):
        model(rows[:, :4], offsets, users)
    with pytest.raises(ValueError, match="heads must divide dim, got dim=8 and heads=3"):
        SASRec(DIM, 4, heads=3)
    with pytest.raises(ValueError, match="k must be >= 1, got 0"):
        hit_rate_ndcg_at_k(torch.randn(2, 3), k=0)
    with pytest.raises(ValueError, match="num_items must be >= 2 to leave a negative, got 1"):
        sample_negatives(torch.Generator(), 2, 3, 1, torch.tensor([0, 0]))
    with pytest.raises(ValueError, match=r"exclude must hold item ids in \[0, 5\), got 0 to 5"):
        sample_negatives(torch.Generator(), 2, 3, 5, torch.tensor([0, 5]))
