"""The arguments a shard's checkpoint calls carry, checked: the checkpoint id and the clock
cut."""

from __future__ import annotations

from ember.ps_server.errors import InvalidArgumentError
from ember.ps_server.shard.step_clocks import MAX_WORLD, sound_job_name

MAX_CHECKPOINT_ID_CHARS = 128


def check_checkpoint_id(checkpoint_id: str) -> None:
    """Refuse a checkpoint id that is empty, longer than :data:`MAX_CHECKPOINT_ID_CHARS` or
    not printable (InvalidArgumentError)."""
    if not 0 < len(checkpoint_id) <= MAX_CHECKPOINT_ID_CHARS or not checkpoint_id.isprintable():
        raise InvalidArgumentError(
            f"checkpoint_id must be 1..{MAX_CHECKPOINT_ID_CHARS} printable characters, "
            f"got {checkpoint_id[:MAX_CHECKPOINT_ID_CHARS]!r}"
        )


def check_cut(cut: dict[str, list[int]]) -> dict[str, list[int]]:
    """``cut`` if every job name is sound and every rank's clock is >= -1.

    Raises:
        InvalidArgumentError: otherwise.
    """
    for job, clocks in cut.items():
        if not sound_job_name(job):
            raise InvalidArgumentError(f"clock cut: bad job name {job[:40]!r}")
        if not 0 < len(clocks) <= MAX_WORLD or min(clocks) < -1:
            raise InvalidArgumentError(
                f"clock cut of job {job!r}: one clock >= -1 per rank, got {clocks[:8]}"
            )
    return cut
