"""Streaming reader of the Criteo TSV format.

Each line: label, 13 integer features, 26 hexadecimal categorical features,
tab-separated; any feature may be empty. Integer features become
``log(1 + max(x, 0))``; a categorical value is hashed with its feature index
into ``[1, buckets)`` and an empty one maps to id 0. Malformed lines are
counted and skipped: the reader never stops on data.

Held-out split: line n of a file (0-based, malformed lines counted too) is
held out for evaluation when ``n % heldout_every == heldout_every - 1`` (with
the default 10, every tenth line); training reads every other line. The split
depends on line positions only, so every reader and every rank agrees on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
from ember.kernels.hash_map import mix64
from ember.trainer.data.batch import Batch, JaggedIds

NUM_DENSE = 13
NUM_SPARSE = 26
_FIELDS = 1 + NUM_DENSE + NUM_SPARSE
_FEATURE_SALT = np.uint64(0x9FB21C651E98DF25)
SPLITS = ("all", "train", "heldout")


@dataclasses.dataclass
class ReaderStats:
    """What the reader saw: lines parsed into samples and lines skipped."""

    lines: int = 0
    samples: int = 0
    malformed: int = 0


class CriteoTSVReader:
    """Batches from Criteo TSV lines.

    Args:
        buckets: id space per categorical feature (one int for all, or 26).
        batch_size: samples per batch; the last batch may be smaller.

    Example:
        >>> reader = CriteoTSVReader(buckets=1000, batch_size=2)
        >>> line = "1\\t" + "\\t".join(["3"] * 13) + "\\t" + "\\t".join(["a9f3"] * 26)
        >>> [b.batch_size for b in reader.batches([line, line, "bad"])], reader.stats.malformed
        ([2], 1)
    """

    def __init__(self, buckets: int | tuple[int, ...] = 1 << 20, batch_size: int = 4096) -> None:
        bucket_list = (buckets,) * NUM_SPARSE if isinstance(buckets, int) else tuple(buckets)
        if len(bucket_list) != NUM_SPARSE or min(bucket_list) < 2:
            raise ValueError(f"buckets must be one int >= 2 or {NUM_SPARSE} of them")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.buckets = np.array(bucket_list, dtype=np.uint64)
        self.batch_size = batch_size
        self.stats = ReaderStats()

    def read(
        self, path: str | Path, split: str = "all", heldout_every: int = 10
    ) -> Iterator[Batch]:
        """Batches of the lines of ``split`` (see the module docstring) of the file at ``path``.

        Raises:
            ValueError: an unknown split, or ``heldout_every`` < 2.
        """
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        if heldout_every < 2:
            raise ValueError(f"heldout_every must be >= 2, got {heldout_every}")
        with open(path, encoding="utf-8", errors="replace") as lines:
            if split == "all":
                yield from self.batches(lines)
                return
            heldout = split == "heldout"
            yield from self.batches(
                line
                for number, line in enumerate(lines)
                if (number % heldout_every == heldout_every - 1) == heldout
            )

    def batches(self, lines: Iterable[str]) -> Iterator[Batch]:
        """Batches of ``lines``; malformed lines are counted in ``stats`` and skipped."""
        labels: list[float] = []
        dense: list[list[float]] = []
        sparse: list[list[int]] = []
        for line in lines:
            self.stats.lines += 1
            parsed = _parse(line.rstrip("\r\n"))
            if parsed is None:
                self.stats.malformed += 1
                continue
            labels.append(parsed[0])
            dense.append(parsed[1])
            sparse.append(parsed[2])
            if len(labels) == self.batch_size:
                yield self._batch(labels, dense, sparse)
                labels, dense, sparse = [], [], []
        if labels:
            yield self._batch(labels, dense, sparse)

    def _batch(
        self, labels: list[float], dense: list[list[float]], sparse: list[list[int]]
    ) -> Batch:
        self.stats.samples += len(labels)
        dense_array = np.log1p(np.maximum(np.array(dense, dtype=np.float64), 0.0)).astype(
            np.float32
        )
        signed = np.array(sparse, dtype=object)  # [batch, 26]; -1 marks an empty field
        empty = signed == -1
        raw = np.where(empty, 0, signed).astype(np.uint64)
        salts = mix64(np.arange(NUM_SPARSE, dtype=np.uint64) ^ _FEATURE_SALT)
        hashed = mix64(raw ^ salts[None, :]) % (self.buckets - np.uint64(1))[None, :] + np.uint64(1)
        ids = np.where(empty, np.uint64(0), hashed).astype(np.int64)
        offsets = torch.arange(len(labels) + 1, dtype=torch.int64)
        features = [
            JaggedIds(torch.from_numpy(ids[:, f].copy()), offsets) for f in range(NUM_SPARSE)
        ]
        return Batch(
            torch.from_numpy(dense_array), features, torch.tensor(labels, dtype=torch.float32)
        )


def _parse(line: str) -> tuple[float, list[float], list[int]] | None:
    fields = line.split("\t")
    if len(fields) != _FIELDS or fields[0] not in ("0", "1"):
        return None
    try:
        dense = [float(int(f)) if f else 0.0 for f in fields[1 : 1 + NUM_DENSE]]
        sparse = [int(f, 16) if f else -1 for f in fields[1 + NUM_DENSE :]]
    except ValueError:
        return None
    if any(value < -1 or value >= 2**64 for value in sparse):  # "-5" parses as hex too
        return None
    return float(fields[0]), dense, sparse
