"""PSEmbeddingBagCollection pools and differentiates as torch's embedding_bag over the whole
table does: bags of one id each (pooled by one gather), longer and empty bags, sum and mean,
all tables' rows in one tensor."""

import pytest
import torch
import torch.nn.functional as F
from ember.trainer.data.batch import JaggedIds
from ember.trainer.embedding import PSEmbeddingBagCollection

ROWS, DIM = 40, 4


class TableRows:
    """A row source over one table in memory (a fake: the pooling above it is under test)."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table, self.updates = table, {}

    def rows(self, requests):
        return {name: self.table[ids].clone() for name, ids in requests.items()}

    def apply_gradients(self, updates):
        self.updates = updates


def _feature(bags: list[list[int]]) -> JaggedIds:
    lengths = torch.tensor([len(bag) for bag in bags])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    return JaggedIds(torch.tensor([i for bag in bags for i in bag], dtype=torch.int64), offsets)


FEATURES = {
    "one id per bag": [[3], [7], [3], [11]],
    "several ids per bag": [[1, 2], [2], [5, 6, 7], [1]],
    "as many ids as bags, one bag empty": [[4, 9], [], [4], [8]],
}
ONE_ID_FEATURES = {  # every feature one id per bag: the forward is one gather
    "a": [[3], [7], [3], [11]],
    "b": [[7], [0], [39], [7]],
    "c": [[5], [5], [5], [5]],
}


@pytest.mark.parametrize("pooling", ["sum", "mean"])
@pytest.mark.parametrize("bags", [FEATURES, ONE_ID_FEATURES], ids=["mixed-bags", "one-id-bags"])
@pytest.mark.parametrize(
    "feature_tables",
    [["t0", "t1", "t2"], ["shared", "shared", "shared"], ["t0", "shared", "shared"]],
    ids=["a-table-each", "one-shared-table", "mixed"],
)
def test_pooled_rows_and_their_gradients_match_embedding_bag(pooling, bags, feature_tables):
    """Features sharing a table pool from one deduplicated set of its rows, and its row
    gradients sum over all of them (scaled by grad_scale)."""
    table = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(1))
    features = [_feature(feature_bags) for feature_bags in bags.values()]
    source = TableRows(table)
    ebc = PSEmbeddingBagCollection(source, feature_tables, pooling=pooling, grad_scale=0.5)
    pooled = ebc(features)
    upstream = torch.randn(pooled.shape, generator=torch.Generator().manual_seed(2))
    (pooled * upstream).sum().backward()
    ebc.step()

    weights = {name: table.clone().requires_grad_(True) for name in set(feature_tables)}
    for f, (name, feature) in enumerate(zip(feature_tables, features)):
        expected = F.embedding_bag(
            feature.values, weights[name], feature.offsets, mode=pooling,
            include_last_offset=True,
        )  # fmt: skip
        torch.testing.assert_close(pooled[:, f].detach(), expected.detach())
        (expected * upstream[:, f]).sum().backward()
    for name, weight in weights.items():
        ids, grads = source.updates[name]
        assert torch.equal(ids, torch.unique(ids))  # distinct, ascending
        torch.testing.assert_close(grads, 0.5 * weight.grad[ids])
        untouched = torch.ones(ROWS, dtype=torch.bool)
        untouched[ids] = False
        assert not weight.grad[untouched].any()  # no row outside the batch has a gradient


def test_a_feature_without_samples_pools_to_nothing():
    ebc = PSEmbeddingBagCollection(TableRows(torch.ones(ROWS, DIM)), ["a", "b"])
    empty = JaggedIds(torch.empty(0, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))
    pooled = ebc.lookup([_feature([[1], [2]]), empty])
    assert pooled[0].shape == (2, DIM) and pooled[1].shape == (0, DIM)


def test_only_batches_of_one_id_bags_take_the_gather():
    ebc = PSEmbeddingBagCollection(TableRows(torch.zeros(ROWS, DIM)), ["a", "b", "c"])
    assert ebc._plan([_feature(bags) for bags in ONE_ID_FEATURES.values()]).one_id_bags
    assert not ebc._plan([_feature(bags) for bags in FEATURES.values()]).one_id_bags


def test_a_table_whose_feature_the_loss_ignores_takes_zero_gradients():
    """One backward covers every table: rows looked up but unused get a zero gradient."""
    source = TableRows(torch.randn(ROWS, DIM))
    ebc = PSEmbeddingBagCollection(source, ["used", "unused"])
    pooled = ebc([_feature([[1], [2]]), _feature([[3], [4]])])
    pooled[:, 0].sum().backward()
    ebc.step()
    assert torch.equal(source.updates["used"][1], torch.ones(2, DIM))
    assert torch.equal(source.updates["unused"][0], torch.tensor([3, 4]))
    assert not source.updates["unused"][1].any()


def test_tables_of_different_widths_are_refused():
    class Widths(TableRows):
        def rows(self, requests):
            return {
                name: torch.zeros(len(ids), 4 if name == "a" else 8)
                for name, ids in requests.items()
            }

    ebc = PSEmbeddingBagCollection(Widths(torch.zeros(1)), ["a", "b"])
    with pytest.raises(ValueError, match=r"share a row width, got \[4, 8\]"):
        ebc([_feature([[1]]), _feature([[2]])])


@pytest.mark.parametrize(
    "feature, message",
    [
        (
            JaggedIds(torch.tensor([1, -2]), torch.tensor([0, 1, 2])),
            "feature 1: ids must be >= 0, got -2",
        ),
        (JaggedIds(torch.tensor([1, 2]), torch.tensor([1, 2])), "feature 1: offsets must rise"),
        (JaggedIds(torch.tensor([1, 2]), torch.tensor([0, 1])), "feature 1: offsets must rise"),
        (
            JaggedIds(torch.tensor([1, 2]), torch.tensor([0, 2, 1, 2])),
            "feature 1: offsets must rise",
        ),
        (
            JaggedIds(torch.tensor([1.0]), torch.tensor([0, 1])),
            "feature 1: ids and offsets must be int64",
        ),
        (
            JaggedIds(torch.tensor([[1]]), torch.tensor([0, 1])),
            "feature 1: ids and offsets must be 1-D",
        ),
        (JaggedIds(torch.tensor([1]), torch.tensor([], dtype=torch.int64)), "at least one offset"),
    ],
)
def test_malformed_features_are_refused_before_any_lookup(feature, message):
    source = TableRows(torch.zeros(ROWS, DIM))
    source.rows = None  # a lookup would fail differently
    ebc = PSEmbeddingBagCollection(source, ["a", "b"])
    with pytest.raises(ValueError, match=message):
        ebc.lookup([_feature([[1]]), feature])
    with pytest.raises(ValueError, match="expected 2 sparse features, got 1"):
        ebc.lookup([_feature([[1]])])


def test_a_batch_of_one_id_bags_is_pooled_without_embedding_bag(monkeypatch):
    """The forward of one-id bags is one gather, laid out [batch, features, dim]."""
    table = torch.randn(ROWS, DIM)
    ebc = PSEmbeddingBagCollection(TableRows(table), ["a", "b", "c"])
    features = [_feature(bags) for bags in ONE_ID_FEATURES.values()]

    def refuse(*args, **kwargs):
        raise AssertionError("embedding_bag called for one-id bags")

    monkeypatch.setattr(F, "embedding_bag", refuse)
    pooled = ebc(features)
    assert pooled.is_contiguous()
    assert torch.equal(pooled, torch.stack([table[f.values] for f in features], dim=1))


def test_a_short_answer_from_the_row_source_is_refused():
    """All tables' rows are one tensor: a table answered short would shift the next one's."""

    class Short(TableRows):
        def rows(self, requests):
            rows = super().rows(requests)
            rows["a"] = rows["a"][:-1]
            return rows

    ebc = PSEmbeddingBagCollection(Short(torch.zeros(ROWS, DIM)), ["a", "b"])
    with pytest.raises(ValueError, match=r"answered \(1, 4\) rows for the 2 ids of table 'a'"):
        ebc([_feature([[1], [2]]), _feature([[3], [4]])])


@pytest.mark.parametrize(
    "values, offsets, expected",
    [
        ([3, 7], [0, 1, 2], True),
        ([], [0], True),  # no samples: vacuously one id each
        ([3, 7], [0, 2], False),
        ([3, 7], [0, 1, 1, 2], False),
        ([3], [2**63 - 1, -(2**63)], False),  # a subtraction would overflow to 1
    ],
)
def test_one_id_per_bag(values, offsets, expected):
    feature = JaggedIds(torch.tensor(values, dtype=torch.int64), torch.tensor(offsets))
    assert feature.one_id_per_bag() is expected
