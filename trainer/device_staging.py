"""DeviceStaging: prefetched rows moved to a GPU as they arrive, on a side stream.

A pipelined row source receives a later step's rows on a background thread
while the current step computes. On a CUDA trainer, :meth:`DeviceStaging.stage`
copies them there, on that thread, into pinned host memory and onto the device
on a stream of their own, so the copy overlaps the step's backward instead of
waiting, pageable and synchronous, at the start of the next forward.
:meth:`DeviceStaging.take` makes the consuming stream wait for the copy (an
event, not a host wait) and marks the rows as used there, so the caching
allocator does not hand their memory out while that stream may still read it.
On the host both are the identity.

Only rows that nothing changes after they arrive may be staged: a pipeline
with staleness 0 patches and steps its prefetched rows on the host, so it
stages them on the host. ``benchmarks/gpu_check.py`` checks the CUDA path.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class StagedRows(NamedTuple):
    """Rows as :meth:`DeviceStaging.stage` left them: ``ready``, recorded on the copy's
    stream after their copies, completes once they are on the device (None: they are
    where they arrived)."""

    rows: dict[str, torch.Tensor]
    ready: torch.cuda.Event | None


class DeviceStaging:
    """Moves rows to ``device`` on a stream of its own where it is a GPU (see the module
    docstring); elsewhere leaves them on the host.

    Args:
        device: the trainer's device.
    """

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    @property
    def stream(self) -> torch.cuda.Stream | None:
        """The stream the copies run on (None on the host)."""
        return self._stream

    def stage(self, rows: dict[str, torch.Tensor]) -> StagedRows:
        """Start moving ``{table: host rows}`` to the device (any thread may call it: the
        device is made current only for the copies, so a background thread of a rank on
        ``cuda:N`` opens no context on ``cuda:0``)."""
        if self._stream is None or not rows:
            return StagedRows(rows, None)
        with torch.cuda.device(self.device), torch.cuda.stream(self._stream):
            moved = {
                table: part.pin_memory().to(self.device, non_blocking=True)
                for table, part in rows.items()
            }
            ready = torch.cuda.Event()
            ready.record(self._stream)
        return StagedRows(moved, ready)

    def take(self, staged: StagedRows) -> dict[str, torch.Tensor]:
        """The rows, usable on the calling thread's current stream of the device."""
        if staged.ready is None:
            return staged.rows
        current = torch.cuda.current_stream(self.device)
        current.wait_event(staged.ready)
        for part in staged.rows.values():
            part.record_stream(current)
        return staged.rows
