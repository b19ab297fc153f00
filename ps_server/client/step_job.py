"""StepJob: who a trainer rank is on the step data plane (its job, world, rank and update
mode), and how its clocks travel."""

from __future__ import annotations

import dataclasses

from ember.ps_server.wire.step_messages import StepClockView

MODES = ("exact", "async")

_MODE_NUMBERS = {"exact": 1, "async": 2}  # ember.v1.UpdateMode


@dataclasses.dataclass(frozen=True)
class StepJob:
    """Who a trainer rank is, for the shards' step clocks.

    Attributes:
        name: the job's name, new for every run (clocks are deduplication keys).
        world: ranks in the job.
        rank: this rank, 0 .. world-1.
        mode: ``exact`` (the shard sums every rank's gradients of a clock into one
            optimizer step per row: N ranks equal one process on their union) or
            ``async`` (each rank's update is its own optimizer step).
        wait_s: how long a shard may hold a request for the other ranks before it
            fails, naming the ranks it waited for.
        replica: the job's ranks train replicas of hot rows, which a checkpoint asks
            them to write back first (see :meth:`StepClient.replicas_flushed`).
    """

    name: str
    world: int = 1
    rank: int = 0
    mode: str = "exact"
    wait_s: float = 60.0
    replica: bool = False

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        if not 0 < len(self.name) <= 128 or not self.name.isprintable():
            raise ValueError(f"job name must be 1..128 printable characters, got {self.name!r}")
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise ValueError(f"rank must be in 0..world-1, got rank {self.rank} of {self.world}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not 0.001 <= self.wait_s <= 3600:
            raise ValueError(f"wait_s must be in [0.001, 3600], got {self.wait_s}")

    @property
    def wait_ms(self) -> int:
        """``wait_s`` as the wire carries it."""
        return max(1, round(self.wait_s * 1000))

    def clock(self, step: int) -> StepClockView:
        """This rank's clock ``step`` as the wire carries it."""
        return StepClockView(
            self.name, self.world, self.rank, step, _MODE_NUMBERS[self.mode], self.wait_ms
        )
