"""The Criteo TSV reader: malformed lines counted and skipped, the held-out split by line."""

import pytest
import torch
from ember.trainer.data.criteo import CriteoTSVReader

from tests.support.criteo_file import write_criteo_file


def _samples(batches) -> list[tuple]:
    return [
        (float(batch.labels[i]), tuple(f.values[i].item() for f in batch.sparse))
        for batch in batches
        for i in range(batch.batch_size)
    ]


def test_the_held_out_split_is_every_nth_line_and_train_is_the_rest(tmp_path):
    path = tmp_path / "day.tsv"
    valid = write_criteo_file(path, 200)
    everything = _samples(CriteoTSVReader(buckets=1000, batch_size=7).read(path))
    train_reader, heldout_reader = (CriteoTSVReader(buckets=1000, batch_size=7) for _ in "ab")
    train = _samples(train_reader.read(path, "train", heldout_every=10))
    heldout = _samples(heldout_reader.read(path, "heldout", heldout_every=10))
    valid_lines = [n for n in range(200) if valid[n]]
    positions = {n: k for k, n in enumerate(valid_lines)}
    assert heldout == [everything[positions[n]] for n in valid_lines if n % 10 == 9]
    assert train == [everything[positions[n]] for n in valid_lines if n % 10 != 9]
    assert heldout_reader.stats.lines == 20 and train_reader.stats.lines == 180
    malformed = sum(not v for v in valid)
    assert train_reader.stats.malformed + heldout_reader.stats.malformed == malformed > 0


def test_bad_splits_are_refused(tmp_path):
    path = tmp_path / "day.tsv"
    write_criteo_file(path, 3)
    reader = CriteoTSVReader(buckets=10, batch_size=2)
    with pytest.raises(ValueError, match="split must be one of all, train, heldout"):
        next(reader.read(path, "test"))
    with pytest.raises(ValueError, match="heldout_every must be >= 2"):
        next(reader.read(path, "train", heldout_every=1))


def test_ids_are_hashed_into_the_buckets_and_empty_fields_are_id_zero(tmp_path):
    path = tmp_path / "day.tsv"
    write_criteo_file(path, 40)
    for batch in CriteoTSVReader(buckets=50, batch_size=8).read(path):
        ids = torch.cat([f.values for f in batch.sparse])
        assert int(ids.min()) >= 0 and int(ids.max()) < 50 and bool((ids == 0).any())
