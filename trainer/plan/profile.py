"""Id-frequency profiles of a workload's tables: counted from a sample, or a Zipf law.

A profile holds, per table, the probability of each id on one lookup, in the
order a hot set takes them (most frequent first), and how many lookups a
sample makes of the table. The counted profile corrects the sample's counts
with Good-Turing estimates: an id seen once in a sample is rarer than one in
the sample size says (it was picked because it was seen), and the ids never
seen share the mass of the ids seen once. Without that correction a planner
overrates the tail of any hot set chosen from the same sample.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np
from ember.trainer.cache.profiler import count_ids
from ember.trainer.data.batch import Batch

GOOD_TURING_MAX_COUNT = 5  # counts above this are frequent enough to be taken as they are


@dataclasses.dataclass(frozen=True)
class TableProfile:
    """One table's id law.

    Attributes:
        name: the table.
        probabilities: float64, each profiled id's, in hot-set order.
        rank_key: descending, what the hot set is chosen by across tables (the sample's
            counts, as the trainer's profiler picks; a law's probabilities).
        lookups_per_sample: ids the table is looked up with per sample (all its features).
        unseen_ids: ids of the table outside ``probabilities`` (never hot).
        unseen_probability: the probability of each of them.
    """

    name: str
    probabilities: np.ndarray
    rank_key: np.ndarray
    lookups_per_sample: float
    unseen_ids: int = 0
    unseen_probability: float = 0.0

    def validate(self) -> None:
        """Raise ValueError naming what is wrong."""
        p, key = self.probabilities, self.rank_key
        if p.ndim != 1 or key.shape != p.shape or (len(p) and p.min() < 0):
            raise ValueError(
                f"table {self.name}: probabilities must be 1-D and >= 0, with a rank key each"
            )
        if bool((np.diff(key) > 0).any()):
            raise ValueError(f"table {self.name}: the rank key must be descending")
        if self.lookups_per_sample <= 0:
            raise ValueError(
                f"table {self.name}: lookups_per_sample must be > 0, got {self.lookups_per_sample}"
            )
        if self.unseen_ids < 0 or self.unseen_probability < 0:
            raise ValueError(f"table {self.name}: unseen ids and their probability must be >= 0")
        total = float(p.sum()) + self.unseen_ids * self.unseen_probability
        if not abs(total - 1.0) < 1e-6:
            raise ValueError(f"table {self.name}: probabilities sum to {total:.6f}, not 1")


def counted_profile(
    batches: Iterable[Batch], feature_tables: Sequence[str], cardinalities: Sequence[int]
) -> list[TableProfile]:
    """Profiles counted over ``batches`` (the sample the hot set is chosen from).

    Args:
        batches: the sample.
        feature_tables: table of each sparse feature.
        cardinalities: ids each feature's table can hold (the unseen ones share the mass
            Good-Turing leaves them); a table's is the largest of its features'.

    Raises:
        ValueError: lengths that do not match, a table never looked up, no sample.
    """
    if len(cardinalities) != len(feature_tables):
        raise ValueError(f"{len(feature_tables)} features but {len(cardinalities)} cardinalities")
    counted, samples = count_ids(batches, feature_tables)
    if not samples:
        raise ValueError("the profile sample has no batch")
    capacity = dict.fromkeys(counted, 0)
    for table, cardinality in zip(feature_tables, cardinalities):
        capacity[table] = max(capacity[table], int(cardinality))
    profiles = []
    for table, (_, counts) in counted.items():
        if not len(counts):
            raise ValueError(f"table {table} is never looked up in the profile sample")
        counts = np.sort(counts.numpy())[::-1]
        profiles.append(_good_turing(table, counts, capacity[table], float(counts.sum()) / samples))
    return profiles


def _good_turing(
    table: str, counts: np.ndarray, cardinality: int, per_sample: float
) -> TableProfile:
    """A profile from descending counts (Good-Turing for the rare ids).

    Counts above ``GOOD_TURING_MAX_COUNT`` keep ``r / N``. The ids seen once give their
    mass, ``n(1) / N``, to the unseen ones (when the table has any). The rare ids, seen
    ``r <= GOOD_TURING_MAX_COUNT`` times, are weighted ``min(r, (r + 1) n(r+1) / n(r))``,
    kept in count order, and scaled to the mass left for them: ``sum r n(r)`` over
    ``2 <= r <= GOOD_TURING_MAX_COUNT`` (over ``r >= 1`` when no id is unseen).
    """
    total = float(counts.sum())
    frequency = np.bincount(counts, minlength=GOOD_TURING_MAX_COUNT + 2)
    weight = np.arange(GOOD_TURING_MAX_COUNT + 1, dtype=np.float64)
    for r in range(1, GOOD_TURING_MAX_COUNT + 1):
        if frequency[r] and frequency[r + 1]:
            weight[r] = min(r, (r + 1) * frequency[r + 1] / frequency[r])
    weight = np.maximum.accumulate(weight)  # a rarer id never outweighs a commoner one
    unseen_ids = max(0, cardinality - len(counts))
    unseen_mass = frequency[1] / total if unseen_ids else 0.0
    rare = counts <= GOOD_TURING_MAX_COUNT
    probabilities = counts / total
    if rare.any():
        rare_mass = float(counts[rare].sum()) / total - unseen_mass
        weights = weight[counts[rare]]
        probabilities[rare] = weights / weights.sum() * rare_mass
    return TableProfile(
        table,
        probabilities,
        counts.astype(np.float64),
        per_sample,
        unseen_ids,
        unseen_mass / unseen_ids if unseen_ids else 0.0,
    )


def zipf_probabilities(cardinality: int, exponent: float) -> np.ndarray:
    """The law of :func:`ember.trainer.data.synthetic.zipf_ranks`: rank r's probability, for
    ranks ``0 .. cardinality-1`` (descending)."""
    if cardinality < 1 or exponent <= 0 or exponent == 1.0:
        raise ValueError(
            f"a Zipf law needs cardinality >= 1 and exponent > 0, != 1; got {cardinality}, "
            f"{exponent}"
        )
    one_minus_s = 1.0 - exponent
    edges = np.arange(cardinality + 1, dtype=np.float64)
    cdf = (np.power(edges + 1.0, one_minus_s) - 1.0) / (
        np.power(cardinality + 1.0, one_minus_s) - 1.0
    )
    cdf[-1] = 1.0  # ranks past the last fold into it, as zipf_ranks clamps them
    return np.diff(cdf)


def zipf_profile(
    name: str, cardinality: int, exponent: float, lookups_per_sample: float = 1.0
) -> TableProfile:
    """A table whose ids follow a bounded Zipf law (id rank r, most popular first)."""
    probabilities = zipf_probabilities(cardinality, exponent)
    return TableProfile(name, probabilities, probabilities, lookups_per_sample)


def fit_zipf_exponent(counts: np.ndarray, cardinality: int) -> float:
    """The bounded-Zipf exponent that best explains descending ``counts`` (maximum
    likelihood over a grid of exponents, ids ranked by their counts)."""
    counts = np.asarray(counts, dtype=np.float64)
    if not len(counts) or counts.sum() <= 0:
        raise ValueError("fitting a Zipf law needs at least one count")
    grid = np.concatenate([np.linspace(0.3, 0.99, 24), np.linspace(1.01, 3.0, 100)])
    ranks = min(len(counts), cardinality)
    likelihood = [
        float(counts[:ranks] @ np.log(zipf_probabilities(cardinality, s)[:ranks] + 1e-300))
        for s in grid
    ]
    return float(grid[int(np.argmax(likelihood))])


def fitted_zipf(counted: TableProfile) -> TableProfile:
    """The Zipf law fitted to a counted profile's counts, over the same cardinality."""
    cardinality = len(counted.probabilities) + counted.unseen_ids
    exponent = fit_zipf_exponent(counted.rank_key, cardinality)
    return zipf_profile(counted.name, cardinality, exponent, counted.lookups_per_sample)
