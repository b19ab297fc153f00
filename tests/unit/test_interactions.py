"""The interactions reader: separators, header, malformed lines, ordering, users, split."""

import pytest
import torch
from ember.trainer.data.interactions import InteractionsFile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def _write(tmp_path, text: str):
    path = tmp_path / "interactions.txt"
    path.write_text(text)
    return path


def _samples(data: InteractionsFile, split: str = "train", batch_size: int = 3) -> list[tuple]:
    """(user, history, target) with the file's raw item ids."""
    samples = []
    raw = data.raw_items
    for batch in data.batches(batch_size, split):
        values, offsets = raw[batch.history.values].tolist(), batch.history.offsets.tolist()
        for b in range(batch.batch_size):
            history = values[offsets[b] : offsets[b + 1]]
            samples.append((int(batch.users[b]), history, int(raw[batch.targets[b]])))
    return samples


def test_the_documented_example(tmp_path):
    path = tmp_path / "log.csv"
    path.write_text("user,item,ts\n1,6,11\n1,5,10\n1,7,12\n2,5,3\n")
    data = InteractionsFile.read(path, max_len=8)
    batch = next(data.batches(batch_size=4))
    assert (batch.history.values.tolist(), batch.targets.tolist(), data.stats.dropped_empty) == (
        [0, 1],
        [2],
        1,
    )
    assert data.raw_items[[0, 1, 2]].tolist() == [5, 6, 7]


def test_tabs_and_commas_mix_and_histories_follow_time_with_ties_in_file_order(tmp_path):
    path = _write(tmp_path, "7\t30\t5\n7,31,2\n7\t32\t5\n7,33,9\n8,40,1.5\n8\t41\t0.5\n")
    data = InteractionsFile.read(path, max_len=10)
    assert _samples(data) == [(7, [31, 30, 32], 33), (8, [41], 40)]
    assert (data.stats.interactions, data.stats.users, data.stats.malformed) == (6, 2, 0)
    assert data.num_items == 6  # items renumbered densely: 30..33, 40, 41


def test_long_histories_keep_their_most_recent_items_and_are_counted(tmp_path):
    lines = [f"1,{item},{item}" for item in range(10)] + ["2,50,0", "2,51,1"]
    data = InteractionsFile.read(_write(tmp_path, "\n".join(lines)), max_len=4)
    assert _samples(data) == [(1, [5, 6, 7, 8], 9), (2, [50], 51)]
    assert data.stats.truncated == 1


def test_malformed_lines_are_counted_with_their_first_numbers_and_skipped(tmp_path):
    bad = ["1,2", "1,2,3,4", "x,2,3", "1,-2,3", "1.5,2,3", "1,2,soon", "1,2,nan", "1,2,inf"]
    good = ["5,1,1", "5,2,2"]
    path = _write(tmp_path, "\n".join([good[0], *bad, "", good[1]]) + "\n")
    data = InteractionsFile.read(path, max_len=4)
    assert data.stats.malformed == len(bad)
    assert data.stats.malformed_lines == [2, 3, 4, 5, 6]
    assert _samples(data) == [(5, [1], 2)]


def test_a_header_is_skipped_only_on_line_one_and_only_when_it_has_no_number(tmp_path):
    data = InteractionsFile.read(_write(tmp_path, "user\titem\ttime\n1\t2\t3\n1\t4\t5\n"), 4)
    assert data.stats.malformed == 0 and _samples(data) == [(1, [2], 4)]
    data = InteractionsFile.read(_write(tmp_path, "1,x,3\n1,2,3\n1,4,5\nuser,item,ts\n"), 4)
    assert data.stats.malformed_lines == [1, 4]


def test_every_nth_user_by_first_appearance_is_held_out(tmp_path):
    # Users appear in the order 30, 10, 20, 40, 50, 60; user 20 has one interaction.
    order = [30, 10, 20, 40, 50, 60]
    lines = [f"{u},{k},{k}" for k, u in enumerate(order)]
    lines += [f"{u},{100 + k},{100 + k}" for k, u in enumerate(order) if u != 20]
    data = InteractionsFile.read(_write(tmp_path, "\n".join(lines)), 4, heldout_every=3)
    assert [s[0] for s in _samples(data, "test")] == [60]  # 20 (n=2) is dropped
    assert [s[0] for s in _samples(data, "train")] == [30, 10, 40, 50]
    assert data.stats.dropped_empty == 1 and data.stats.users == 6
    assert data.num_samples("train") == 4 and data.num_samples("test") == 1


def test_a_seed_shuffles_the_users_reproducibly(tmp_path):
    lines = [f"{u},{u + k},{k}" for u in range(40) for k in range(3)]
    data = InteractionsFile.read(_write(tmp_path, "\n".join(lines)), 4, heldout_every=1000)
    plain = _samples(data, batch_size=7)
    shuffled = [s for b in data.batches(7, seed=3) for s in b.users.tolist()]
    assert shuffled == [s for b in data.batches(7, seed=3) for s in b.users.tolist()]
    assert shuffled != [s[0] for s in plain] and sorted(shuffled) == list(range(40))
    assert [b.batch_size for b in data.batches(16)] == [16, 16, 8]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(st.integers(0, 6), st.integers(0, 50), st.integers(0, 5)), min_size=1, max_size=40
    ),
    st.integers(1, 4),
)
def test_samples_match_a_per_user_reference(tmp_path, rows, max_len):
    path = _write(tmp_path, "".join(f"{u}\t{i}\t{t}\n" for u, i, t in rows))
    data = InteractionsFile.read(path, max_len, heldout_every=2)
    users = list(dict.fromkeys(u for u, _, _ in rows))
    expected = {"train": [], "test": []}
    for n, user in enumerate(users):
        items = [i for _, i, _ in sorted((r for r in rows if r[0] == user), key=lambda r: r[2])]
        if len(items) >= 2:
            split = "test" if n % 2 == 1 else "train"
            expected[split].append((user, items[:-1][-max_len:], items[-1]))
    assert _samples(data, "train") == expected["train"]
    assert _samples(data, "test") == expected["test"]
    assert data.stats.dropped_empty == sum(1 for u in users if sum(r[0] == u for r in rows) < 2)


def test_bad_arguments_and_files_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"interactions file .*missing\.txt not found"):
        InteractionsFile.read(tmp_path / "missing.txt", 4)
    with pytest.raises(ValueError, match="max_len must be >= 1, got 0"):
        InteractionsFile.read(tmp_path / "missing.txt", 0)
    with pytest.raises(ValueError, match="heldout_every must be >= 2, got 1"):
        InteractionsFile.read(tmp_path / "missing.txt", 4, heldout_every=1)
    path = _write(tmp_path, "user,item,ts\n1,2\n-1,2,3\n")
    with pytest.raises(
        ValueError, match=r"no valid interaction .* 2 malformed lines \(first at lines 2, 3\)"
    ):
        InteractionsFile.read(path, 4)
    data = InteractionsFile.read(_write(tmp_path, "1,2,3\n1,3,4\n"), 4)
    with pytest.raises(ValueError, match="split must be one of train, test, got 'heldout'"):
        next(data.batches(4, "heldout"))
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        next(data.batches(0))
    assert isinstance(next(data.batches(4)).targets, torch.Tensor)
