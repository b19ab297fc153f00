"""Next-item samples from a plain interactions file.

One interaction per line: ``user<sep>item<sep>timestamp``, where the separator
is a tab if the line has one, else a comma (decided per line). User and item
are non-negative integers, the timestamp any finite number. Line 1 is a header,
and skipped, when none of its fields is a number. Blank lines are ignored;
every other line that breaks these rules is malformed: counted, its number
remembered among the first few, and skipped. The reader never stops on data.

A user's interactions are ordered by timestamp, ties in file order. The last
one is the target and the others, cut to the ``max_len`` most recent, the
history; a user with fewer than 2 interactions is dropped and counted.

Held-out split: users are numbered 0, 1, ... in order of first appearance in
the file (valid lines only, dropped users included); user n is held out
("test") when ``n % heldout_every == heldout_every - 1``, so every tenth user
with the default. The split depends on the file's order alone.

Items are renumbered densely, ``0 .. num_items-1`` in ascending order of their
ids in the file (``raw_items`` maps back): sparse ids would otherwise size the
item space by the largest id.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from array import array
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from ember.trainer.data.sequences import SequenceBatch, SequenceStats, recent_history

SPLITS = ("train", "test")
MALFORMED_LINES_KEPT = 5
_INT64_MAX = (1 << 63) - 1
logger = logging.getLogger(__name__)


@dataclasses.dataclass
class InteractionStats(SequenceStats):
    """What the reader saw, on top of the truncated and dropped users.

    Attributes:
        interactions: valid lines.
        malformed: lines skipped as malformed.
        malformed_lines: 1-based numbers of the first few malformed lines.
        users: distinct users in valid lines, dropped ones included.
    """

    interactions: int = 0
    malformed: int = 0
    malformed_lines: list[int] = dataclasses.field(default_factory=list)
    users: int = 0


class InteractionsFile:
    """The samples of one interactions file, read whole, split into train and test users.

    Attributes:
        stats: what :meth:`read` saw.
        num_items: items seen (their ids are renumbered densely: ``0 .. num_items-1``).
        raw_items: int64 [num_items], the file's id of each item (ascending).

    Example:
        With ``log.csv`` holding the lines ``user,item,ts``, ``1,6,11``, ``1,5,10``,
        ``1,7,12`` and ``2,5,3``:

        >>> data = InteractionsFile.read("log.csv", max_len=8)  # doctest: +SKIP
        >>> batch = next(data.batches(batch_size=4))  # doctest: +SKIP
        >>> batch.history.values.tolist(), batch.targets.tolist(), data.stats.dropped_empty  # doctest: +SKIP
        ([0, 1], [2], 1)
        >>> data.raw_items.tolist()  # doctest: +SKIP
        [5, 6, 7]
    """

    def __init__(
        self, splits: dict[str, SequenceBatch], raw_items: np.ndarray, stats: InteractionStats
    ) -> None:
        self._splits = splits
        self.raw_items = torch.from_numpy(raw_items)
        self.num_items = len(raw_items)
        self.stats = stats

    @classmethod
    def read(cls, path: str | Path, max_len: int, heldout_every: int = 10) -> InteractionsFile:
        """Read the file at ``path`` (see the module docstring for the format and rules).

        Args:
            path: the interactions file.
            max_len: the longest history kept.
            heldout_every: every ``heldout_every``-th user (by first appearance) is a test user.

        Returns:
            The file's samples and statistics.

        Raises:
            FileNotFoundError: no file at ``path``.
            ValueError: ``max_len`` < 1, ``heldout_every`` < 2, or no valid line in the file.
        """
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        if heldout_every < 2:
            raise ValueError(f"heldout_every must be >= 2, got {heldout_every}")
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"interactions file {path} not found")
        stats = InteractionStats()
        users, items, times = _parse_file(path, stats)
        if not users:
            raise ValueError(
                f"no valid interaction in {path}: {stats.malformed} malformed lines"
                + _first_lines(stats)
            )
        if stats.malformed:
            logger.warning(
                "%s: skipped %d malformed lines%s", path, stats.malformed, _first_lines(stats)
            )
        # Items are renumbered densely (ascending raw id): sparse raw ids would otherwise size
        # the item space (negatives, popularity) by the largest id, not by the items seen.
        raw_items, item_ids = np.unique(np.frombuffer(items, np.int64), return_inverse=True)
        splits = _samples(
            np.frombuffer(users, np.int64),
            item_ids.astype(np.int64),
            np.frombuffer(times, np.float64),
            max_len,
            heldout_every,
            stats,
        )
        return cls(splits, raw_items, stats)

    def summary(self) -> tuple[int, int, int, int]:
        """``(train samples, test samples, items, interactions)``: what two readers of one
        file must agree on."""
        return (
            self.num_samples("train"), self.num_samples("test"), self.num_items,
            self.stats.interactions,
        )  # fmt: skip

    def popularity_ranking(self, k: int) -> torch.Tensor:
        """The ``k`` items seen most often in the training users' histories and targets
        (ties to the lower id).

        Raises:
            ValueError: ``k`` not in ``[1, num_items]``.
        """
        if not 1 <= k <= self.num_items:
            raise ValueError(f"k must be in [1, {self.num_items}], got {k}")
        train = self._split("train")
        items = torch.cat([train.history.values, train.targets])
        counts = torch.bincount(items, minlength=self.num_items)
        return torch.argsort(-counts, stable=True)[:k]

    def num_samples(self, split: str = "train") -> int:
        """Samples (kept users) of ``split``."""
        return self._split(split).batch_size

    def batches(
        self, batch_size: int, split: str = "train", seed: int | None = None
    ) -> Iterator[SequenceBatch]:
        """Batches of ``split`` ("train" or "test"); the last one may be smaller.

        Args:
            batch_size: samples per batch.
            split: "train" or "test".
            seed: None for users in order of first appearance, else a shuffle by this seed.

        Raises:
            ValueError: ``batch_size`` < 1 or an unknown split.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        samples = self._split(split)
        order = torch.arange(samples.batch_size)
        if seed is not None:
            order = torch.randperm(
                samples.batch_size, generator=torch.Generator().manual_seed(seed)
            )
        for start in range(0, samples.batch_size, batch_size):
            yield samples.select(order[start : start + batch_size])

    def _split(self, split: str) -> SequenceBatch:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        return self._splits[split]


def _parse_file(path: Path, stats: InteractionStats) -> tuple[array, array, array]:
    users, items, times = array("q"), array("q"), array("d")
    with open(path, encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, start=1):
            fields = line.rstrip("\r\n").split("\t" if "\t" in line else ",")
            if len(fields) == 1 and not fields[0].strip():
                continue
            parsed = _parse(fields)
            if parsed is None:
                if number == 1 and not any(_is_number(f) for f in fields):
                    continue
                stats.malformed += 1
                if len(stats.malformed_lines) < MALFORMED_LINES_KEPT:
                    stats.malformed_lines.append(number)
                continue
            users.append(parsed[0])
            items.append(parsed[1])
            times.append(parsed[2])
    stats.interactions = len(users)
    return users, items, times


def _parse(fields: list[str]) -> tuple[int, int, float] | None:
    if len(fields) != 3:
        return None
    user, item, stamp = (f.strip() for f in fields)
    if not (_is_id(user) and _is_id(item) and _is_number(stamp)):
        return None
    return int(user), int(item), float(stamp)


def _is_id(field: str) -> bool:
    return field.isascii() and field.isdigit() and int(field) <= _INT64_MAX


def _is_number(field: str) -> bool:
    try:
        return math.isfinite(float(field))
    except ValueError:
        return False


def _first_lines(stats: InteractionStats) -> str:
    if not stats.malformed_lines:
        return ""
    numbers = ", ".join(map(str, stats.malformed_lines))
    return f" (first at lines {numbers})"


def _samples(
    users: np.ndarray,
    items: np.ndarray,
    times: np.ndarray,
    max_len: int,
    heldout_every: int,
    stats: InteractionStats,
) -> dict[str, SequenceBatch]:
    distinct, first_seen, per_user = np.unique(users, return_index=True, return_inverse=True)
    stats.users = len(distinct)
    # Users renumbered by first appearance; one stable sort groups and time-orders them.
    appearance = np.empty(len(distinct), dtype=np.int64)
    appearance[np.argsort(first_seen, kind="stable")] = np.arange(len(distinct))
    user_no = appearance[per_user]
    order = np.lexsort((np.arange(len(users)), times, user_no))
    counts = np.bincount(user_no, minlength=len(distinct))
    ends = np.cumsum(counts)
    starts = ends - counts
    user_ids = users[order][starts]
    stats.dropped_empty += int((counts < 2).sum())
    heldout = np.arange(len(distinct)) % heldout_every == heldout_every - 1
    sorted_items = items[order]
    splits = {}
    for split, members in (("train", ~heldout), ("test", heldout)):
        keep = members & (counts >= 2)
        history = recent_history(sorted_items, starts[keep], ends[keep] - 1, max_len, stats)
        splits[split] = SequenceBatch(
            torch.from_numpy(user_ids[keep]),
            history,
            torch.from_numpy(sorted_items[ends[keep] - 1]),
        )
    return splits
