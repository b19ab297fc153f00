"""Work one rank does for all: rank 0 computes, every rank gets the result or its error."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch.distributed as dist

T = TypeVar("T")


def decided_on_rank_zero(
    work: Callable[[], T], world: int, what: str, error: type[Exception] = ValueError
) -> T:
    """``work()`` run on rank 0 and broadcast to every rank, so all ranks act alike.

    A failure on rank 0 is raised on every rank as ``error("<what> on rank 0 failed: ...")``
    instead of leaving the others waiting in the broadcast.
    """
    outcome: list = [None, None]  # the result, or why there is none
    if world == 1 or dist.get_rank() == 0:
        try:
            outcome[0] = work()
        except Exception as failure:  # noqa: BLE001 - every rank raises it below
            outcome[1] = str(failure) if isinstance(failure, ValueError) else repr(failure)
    if world > 1:
        dist.broadcast_object_list(outcome, src=0)
    if outcome[1] is not None:
        raise error(f"{what} on rank 0 failed: {outcome[1]}")
    return outcome[0]
