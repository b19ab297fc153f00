import torch
from ember.trainer.traffic import CountingClient

from tests.support.fake_ps import FakePSClient


def test_counts_payload_bytes_of_every_call_kind():
    fake = FakePSClient(dim=4)
    client = CountingClient(fake)
    client.pull_many({"t": torch.tensor([1, 2, 3])})
    traffic = client.traffic
    assert (traffic.rows_pulled, traffic.bytes_pulled) == (3, 3 * 8 + 3 * 16)  # ids, rows
    assert traffic.bytes_control == 3 * 8  # versions
    client.push_many(
        {
            "t": (torch.tensor([1]), torch.ones(1, 4)),
            "u": (torch.tensor([], dtype=torch.long), torch.ones(0, 4)),
        }
    )
    assert (client.traffic.rows_pushed, client.traffic.bytes_pushed) == (1, 8 + 16)
    assert [p[0] for p in fake.pushed] == ["t"]  # the empty table was not sent
    ((positions, _, _),) = client.pull_stale_many(
        [("t", torch.tensor([1, 2]), torch.zeros(2, dtype=torch.long), 0)]
    )
    assert positions.tolist() == [0]  # id 1 was pushed once
    assert traffic.bytes_pulled == 3 * 8 + 3 * 16 + 1 * 16  # plus the one stale row
    # the check: ids and held versions sent, position and version of the stale row back
    assert traffic.bytes_control == 3 * 8 + 2 * 16 + 1 * 16
    client.pull_stale_many([("t", torch.tensor([7]), torch.tensor([-1]), 0)])  # a miss
    assert traffic.bytes_pulled == 3 * 8 + 3 * 16 + 16 + (8 + 16)  # its id asked, its row
    assert traffic.bytes_control == 3 * 8 + 2 * 16 + 16 + (8 + 16)  # held -1; position, version
