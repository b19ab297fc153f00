"""PSEmbeddingBagCollection pools and differentiates as torch's embedding_bag over the whole
table does: bags of one id each (pooled by a gather), longer and empty bags, sum and mean."""

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


@pytest.mark.parametrize("pooling", ["sum", "mean"])
@pytest.mark.parametrize(
    "feature_tables",
    [["t0", "t1", "t2"], ["shared", "shared", "shared"], ["t0", "shared", "shared"]],
    ids=["a-table-each", "one-shared-table", "mixed"],
)
def test_pooled_rows_and_their_gradients_match_embedding_bag(pooling, feature_tables):
    """Features sharing a table pool from one deduplicated set of its rows, and its row
    gradients sum over all of them."""
    table = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(1))
    features = [_feature(bags) for bags in FEATURES.values()]
    source = TableRows(table)
    ebc = PSEmbeddingBagCollection(source, feature_tables, pooling=pooling)
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
        torch.testing.assert_close(grads, weight.grad[ids])
        untouched = torch.ones(ROWS, dtype=torch.bool)
        untouched[ids] = False
        assert not weight.grad[untouched].any()  # no row outside the batch has a gradient


def test_a_feature_without_samples_pools_to_nothing():
    ebc = PSEmbeddingBagCollection(TableRows(torch.ones(ROWS, DIM)), ["a", "b"])
    empty = JaggedIds(torch.empty(0, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))
    pooled = ebc.lookup([_feature([[1], [2]]), empty])
    assert pooled[0].shape == (2, DIM) and pooled[1].shape == (0, DIM)


def test_only_bags_of_exactly_one_id_take_the_gather():
    ebc = PSEmbeddingBagCollection(TableRows(torch.zeros(ROWS, DIM)), ["a", "b", "c"])
    plan = ebc._plan([_feature(bags) for bags in FEATURES.values()])
    assert plan.one_id_bags == [True, False, False]
