"""WriteGate: lets a checkpoint hold a shard's writes at one moment, under a lease.

Writers enter :meth:`WriteGate.writing`; :meth:`WriteGate.pause` waits for the
writers inside to leave and holds new ones until :meth:`WriteGate.resume` with
the same checkpoint id, or until the lease runs out (a coordinator that died
mid-checkpoint cannot stall the shard for longer than that). While paused,
:meth:`WriteGate.admit_until` lets the writes a checkpoint still needs through
(tagged writes its predicate accepts, such as the clocks up to a clock cut).
The checkpoint that writes its files :meth:`WriteGate.claim`s the gate: until
it ends the claim, no lease, late pause or resume of its id lets writes in.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ember.ps_server.errors import CheckpointStateError

log = logging.getLogger(__name__)


class WriteGate:
    """Admission of write requests, pausable by one checkpoint at a time."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._writers = 0
        self._held = 0  # writers waiting for a pause to end
        self._holder: str | None = None  # checkpoint id holding the pause
        self._deadline = 0.0
        self._expired: set[str] = set()
        self._admits: Callable[[Any], bool] | None = None  # writes let through a pause
        self._claimed = False  # the holder writes its files (see claim)

    @contextlib.contextmanager
    def writing(
        self, tag: Any = None, release: threading.Condition | None = None
    ) -> Iterator[None]:
        """Run one write request: waits while a checkpoint holds the gate, unless the
        checkpoint admits ``tag`` (see :meth:`admit_until`). A caller holding ``release``
        (acquired once) has it released while it waits and acquired again before writing."""
        with self._cond:
            held = self._holds(tag)
            if held and release is not None:
                release.release()
            if held:
                self._held += 1
                self._cond.notify_all()
            while self._holds(tag):
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    log.warning(
                        "checkpoint %s held writes past its lease; resuming writes", self._holder
                    )
                    self._expired.add(self._holder)
                    self._release()
                    break
                self._cond.wait(None if math.isinf(remaining) else remaining)
            self._held -= held
            self._writers += 1  # counted before ``release`` is taken again: pauses wait
        if held and release is not None:
            release.acquire()  # never under this gate's lock (writers take it the other way)
        try:
            yield
        finally:
            with self._cond:
                self._writers -= 1
                self._cond.notify_all()

    def _holds(self, tag: Any) -> bool:
        admitted = tag is not None and self._admits is not None and self._admits(tag)
        return self._holder is not None and not admitted

    def admit_until(
        self, checkpoint_id: str, admits: Callable[[Any], bool], reached: Callable[[], bool]
    ) -> bool:
        """While ``checkpoint_id`` holds the gate, let writes whose tag ``admits`` accepts
        through until ``reached()``; then hold every write again and wait for the admitted
        ones inside to finish. False (and the gate released, the id refused from then on)
        when the lease runs out first; False at once if the id does not hold the gate.

        ``reached`` is checked whenever a writer leaves and at :meth:`recheck`, so it must
        turn true inside a write that ``admits`` lets through, or before a recheck.
        """
        with self._cond:
            if self._holder != checkpoint_id:
                return False
            self._admits = admits
            self._cond.notify_all()
            try:
                while not reached():
                    remaining = self._deadline - time.monotonic()
                    if remaining <= 0:
                        self._expired.add(checkpoint_id)
                        self._release()
                        return False
                    self._cond.wait(None if math.isinf(remaining) else remaining)
                    if self._holder != checkpoint_id:
                        return False
            finally:
                self._admits = None
            while self._writers:
                self._cond.wait()
            return True

    def recheck(self) -> None:
        """Have a waiting :meth:`admit_until` check its ``reached`` now (something it
        depends on changed outside a write)."""
        with self._cond:
            self._cond.notify_all()

    def await_admitting(self, timeout_s: float) -> bool:
        """Wait until a checkpoint waits in :meth:`admit_until` (tests, diagnostics); False on
        timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._admits is not None, timeout_s)

    def await_held(self, count: int, timeout_s: float) -> bool:
        """Wait until at least ``count`` writers are held by a pause; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._held >= count, timeout_s)

    def pause(self, checkpoint_id: str, lease_s: float) -> None:
        """Hold new writes for ``checkpoint_id`` and wait for those in flight to finish.

        Raises:
            CheckpointStateError: another checkpoint holds the gate, or this one writes its
                files now (a late or repeated call).
        """
        with self._cond:
            self._refuse_claimed(checkpoint_id)
            if self._holder is not None and self._holder != checkpoint_id:
                if time.monotonic() < self._deadline:
                    raise CheckpointStateError(
                        f"checkpoint {self._holder!r} is in progress; retry {checkpoint_id!r} later"
                    )
                self._expired.add(self._holder)
            self._holder = checkpoint_id
            self._deadline = time.monotonic() + lease_s
            self._expired.discard(checkpoint_id)
            while self._writers:
                self._cond.wait()

    def claim(self, checkpoint_id: str) -> None:
        """Keep holding the gate for ``checkpoint_id`` past its lease, until
        :meth:`end_claim`; meanwhile a pause of the id is refused and a resume ignored.

        A shard writing its checkpoint files is busy, not gone: the lease only
        guards the wait for the coordinator between pause and write. A late or
        repeated call of the coordinator must not let writes in under the files.

        Raises:
            CheckpointStateError: ``checkpoint_id`` does not hold the gate within its lease,
                or claimed it already.
        """
        with self._cond:
            self._refuse_claimed(checkpoint_id)
            if self._holder == checkpoint_id and time.monotonic() < self._deadline:
                self._deadline = float("inf")
                self._claimed = True
                return
            if checkpoint_id in self._expired or self._holder == checkpoint_id:
                reason = "its pause lease ran out and writes resumed"
            else:
                reason = "writes were not paused for it (call PauseWrites first)"
            raise CheckpointStateError(f"checkpoint {checkpoint_id!r} refused: {reason}")

    def resume(self, checkpoint_id: str) -> bool:
        """Let writes in again, if ``checkpoint_id`` holds the gate and has not claimed it
        (otherwise nothing to do: a claim ends with :meth:`end_claim`); whether it had: the
        resume was ignored, writes still held while that checkpoint writes its files."""
        with self._cond:
            if self._holder == checkpoint_id and self._claimed:
                log.warning(
                    "resume of checkpoint %s ignored: it writes its files now, and writes "
                    "resume when they are written",
                    checkpoint_id,
                )
                return True
            if self._holder == checkpoint_id:
                self._release()
            return False

    def end_claim(self, checkpoint_id: str) -> None:
        """End the claim of ``checkpoint_id`` (its files are written, or failed) and let
        writes in again."""
        with self._cond:
            if self._holder == checkpoint_id and self._claimed:
                self._release()

    def _refuse_claimed(self, checkpoint_id: str) -> None:
        """Refuse a pause or claim of an id that writes its files now."""
        if self._holder == checkpoint_id and self._claimed:
            raise CheckpointStateError(
                f"checkpoint {checkpoint_id!r} refused: it writes its files here now (a late "
                "or repeated call?)"
            )

    def _release(self) -> None:
        self._holder = None
        self._claimed = False
        self._cond.notify_all()
