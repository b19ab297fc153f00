import itertools

import numpy as np
import pytest
from ember.trainer.metrics import log_loss, roc_auc


def _pairwise_auc(labels, scores):
    pos = [s for s, y in zip(scores, labels) if y == 1]
    neg = [s for s, y in zip(scores, labels) if y == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def test_auc_matches_pairwise_definition_with_ties():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 300)
    scores = np.round(rng.random(300) + 0.3 * labels, 1)  # rounding makes many ties
    assert roc_auc(labels, scores) == pytest.approx(_pairwise_auc(labels, scores), abs=1e-12)


def test_auc_extremes_and_errors():
    assert roc_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.2, 0.8, 0.9])) == 1.0
    assert roc_auc(np.array([1, 1, 0, 0]), np.array([0.1, 0.2, 0.8, 0.9])) == 0.0
    with pytest.raises(ValueError, match="both classes"):
        roc_auc(np.array([1, 1]), np.array([0.3, 0.4]))


def test_log_loss_matches_float64_formula():
    labels = np.array([1, 0, 1, 0])
    p = np.array([0.9, 0.2, 0.6, 0.5])
    expected = -np.mean([np.log(0.9), np.log(0.8), np.log(0.6), np.log(0.5)])
    assert log_loss(labels, p) == pytest.approx(expected, rel=1e-12)
