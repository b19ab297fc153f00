"""Rows two steps share, stepped by the trainer: which rows, when that is allowed, and the
step against a float64 reference; and where an update's state answers land."""

import numpy as np
import pytest
import torch
from ember.ps_server.client.joined_ids import JoinedIds
from ember.ps_server.client.joined_state import JoinedState
from ember.ps_server.errors import InvalidArgumentError
from ember.ps_server.wire.row_dtype import RowDtype
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec
from ember.trainer.shared_rows import SharedRows

from tests.support.reference import ReferenceRow


def test_the_shared_rows_are_the_ids_both_steps_have_at_both_positions():
    earlier = {"a": torch.tensor([9, 1, 5]), "b": torch.tensor([2]), "c": torch.tensor([7])}
    later = {"a": torch.tensor([5, 3, 9]), "b": torch.tensor([4]), "d": torch.tensor([7])}
    shared = SharedRows.between(earlier, later)
    assert list(shared.by_table) == ["a"]  # b shares nothing; d is not in the earlier step
    ids, at_later, at_earlier = shared.by_table["a"]
    assert ids.tolist() == [5, 9] and at_later.tolist() == [0, 2] and at_earlier.tolist() == [2, 0]
    assert {t: i.tolist() for t, i in shared.ids.items()} == {"a": [5, 9]}


def test_rows_are_stepped_here_only_when_the_update_carries_exactly_the_announced_ids():
    earlier = {"a": torch.tensor([1, 2]), "b": torch.tensor([3]), "c": torch.tensor([4])}
    shared = SharedRows.between(earlier, {"a": torch.tensor([2]), "b": torch.tensor([3])})
    assert list(shared.by_table) == ["a", "b"]  # c shares nothing
    grads = torch.ones(2, 4)
    announced = {t: (ids, grads[: len(ids)]) for t, ids in earlier.items()}
    assert shared.steppable({})  # no gradients: no row changes
    assert shared.steppable(announced)
    for changed in (
        {**announced, "a": (torch.tensor([2, 1]), grads)},  # other ids of a shared table
        {**announced, "c": (torch.tensor([2]), grads[:1])},  # of a table sharing nothing
        {t: announced[t] for t in ("a", "b")},  # a table short
        {**announced, "d": (torch.tensor([2]), grads[:1])},  # a table not announced
    ):
        assert not shared.steppable(changed)


@pytest.mark.parametrize("kind", [OptimizerKind.SGD, OptimizerKind.ADAGRAD, OptimizerKind.ADAM])
def test_stepping_the_shared_rows_matches_a_float64_reference(kind):
    optimizer = OptimizerSpec(kind, lr=0.1, eps=1e-8)
    rng = np.random.default_rng(5)
    earlier = {"a": torch.tensor([4, 8, 15]), "b": torch.tensor([16, 23])}
    later = {"a": torch.tensor([15, 42, 4]), "b": torch.tensor([23])}
    shared = SharedRows.between(earlier, later)
    rows = {
        t: torch.from_numpy(rng.standard_normal((len(i), 3)).astype("f4")) for t, i in later.items()
    }
    before = {t: r.clone() for t, r in rows.items()}
    width = {OptimizerKind.SGD: 0, OptimizerKind.ADAGRAD: 3, OptimizerKind.ADAM: 6}[kind]
    states = {
        t: (torch.tensor([2] * len(i)), torch.from_numpy(rng.random((len(i), width)).astype("f4")))
        for t, (i, _, _) in shared.by_table.items()
    }
    updates = {t: (i, torch.from_numpy(rng.standard_normal((len(i), 3)).astype("f4")))
               for t, i in earlier.items()}  # fmt: skip
    shared.step(rows, {t: (v.clone(), s.clone()) for t, (v, s) in states.items()}, updates,
                {t: optimizer for t in later})  # fmt: skip
    for table, (_, at_later, at_earlier) in shared.by_table.items():
        versions, state = states[table]
        for row, pos in enumerate(at_later.tolist()):
            reference = ReferenceRow(before[table][pos].numpy(), optimizer)
            held = state[row].numpy().astype(np.float64)
            reference.steps, reference.sum_sq = int(versions[row]), held
            reference.m, reference.v = held[:3], held[3:]
            reference.apply(updates[table][1][at_earlier[row]].numpy())
            np.testing.assert_allclose(rows[table][pos].numpy(), reference.w, rtol=1e-5, atol=1e-6)
    untouched = torch.tensor([1])  # id 42: not in the earlier step
    assert torch.equal(rows["a"][untouched], before["a"][untouched])


def test_state_answers_land_at_their_ids_positions_and_a_short_answer_is_refused():
    ids = JoinedIds(["w", "s"], [np.array([7, 3, 9]), np.array([5])], [2, 2],
                    [RowDtype.FLOAT32] * 2, 1)  # fmt: skip
    state = JoinedState(ids, {"w": 2, "s": 0})  # an Adagrad-like and an SGD table
    payloads = []
    for table, shard_ids, _ in ids.entries(0):
        width = 2 if table == "w" else 0
        payloads += [
            shard_ids.astype("<i8") * 10,
            (np.repeat(shard_ids, width) + 0.5).astype("<f4"),
        ]
    payload = memoryview(b"".join(p.tobytes() for p in payloads))
    with pytest.raises(InvalidArgumentError, match="must hold"):
        state.place(0, payload[:-1])
    state.place(0, payload)
    placed = state.states()
    assert list(placed) == ["w", "s"]
    assert placed["w"][0].tolist() == [70, 30, 90]
    assert placed["w"][1].tolist() == [[7.5, 7.5], [3.5, 3.5], [9.5, 9.5]]
    assert placed["s"][0].tolist() == [50] and tuple(placed["s"][1].shape) == (1, 0)
