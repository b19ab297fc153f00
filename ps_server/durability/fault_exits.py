"""FaultExits: how often a supervised shard exited on faults lately, kept beside its
write-ahead log (``shard-S.fault-exits.json``), so that a fault that comes back at every
start (a Redis evicting the marker key, a proxy whose server id changes per connection)
does not loop through exits and rebuilds without end: past :data:`MAX_FAULT_EXITS` exits
within :data:`FAULT_EXIT_WINDOW_S`, the shard waits for an operator instead of exiting.
"""

from __future__ import annotations

import json
import math
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from ember.ps_server.durability.durable_files import write_durably

MAX_FAULT_EXITS = 3
FAULT_EXIT_WINDOW_S = 600.0
_MAX_RECORD_BYTES = 4096  # the record holds MAX_FAULT_EXITS times


class FaultExits:
    """The fault exits of shard ``shard`` whose log is in ``directory``.

    Args:
        directory: the shard's write-ahead log directory.
        shard: the shard's index.
        clock: seconds since the epoch (the exits outlive the process).
    """

    def __init__(self, directory: Path, shard: int, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(directory) / f"shard-{shard}.fault-exits.json"
        self._clock = clock

    def take(self) -> str | None:
        """Record an exit now (durably) and return None, or return why the shard must not
        exit: as many exits within the window already, or a record that cannot be read or
        written (when in doubt, an operator decides)."""
        now = self._clock()
        try:
            times = self._read()
        except FileNotFoundError:  # none yet
            times = []
        except (OSError, ValueError) as error:
            return f"cannot read its record of fault exits {self.path} ({error})"
        # Exits dated after now count too: a clock stepped back must not reset the budget.
        recent = sorted(t for t in times if now - t < FAULT_EXIT_WINDOW_S)[-MAX_FAULT_EXITS:]
        if len(recent) >= MAX_FAULT_EXITS:
            return (
                f"it exited on faults {len(recent)} times in the last "
                f"{FAULT_EXIT_WINDOW_S / 60:g} minutes (recorded in {self.path}; delete it once "
                "the cause is fixed): the fault comes back after every restart"
            )
        try:
            write_durably(self.path, json.dumps([*recent, now]).encode())
        except OSError as error:
            return f"cannot record this exit in {self.path} ({error})"
        return None

    def _read(self) -> list[float]:
        """The recorded exit times (a small regular file: never through a link, never
        blocking on a FIFO planted there).

        Raises:
            OSError, ValueError: it cannot be read, or is not a short list of finite times.
        """
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError("not a regular file")
            data = handle.read(_MAX_RECORD_BYTES + 1)
        if len(data) > _MAX_RECORD_BYTES:
            raise ValueError(f"longer than {_MAX_RECORD_BYTES} bytes")
        times = json.loads(data)
        if not isinstance(times, list) or not all(
            isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t)
            for t in times
        ):
            raise ValueError("not a list of finite times")
        return [float(t) for t in times]
