"""ReservedRows: a store's row array that grows without copying and without a 2x peak.

Doubling a tensor copies every row and holds the old and the new one at once,
so a table filling up briefly needs twice its memory. Instead the array is a
view of an anonymous private mapping that reserves address space for as many
rows as the machine's memory could hold (``MAP_NORESERVE``: no memory is
committed for it); the kernel backs pages as rows first touch them, so
growing costs nothing and resident memory is the rows held. Row lookup stays
one index into one contiguous tensor. Arrays past :data:`HUGE_PAGES_FROM` ask
for transparent huge pages, which cut the TLB misses of random row access
(a checkpoint's gather of 4M rows: 5.2 s on 4 KiB pages, 1.7 s on 2 MiB).

Where the kernel refuses such a reservation (strict overcommit, an address
space limit) the array is an ordinary tensor that doubles, with a warning.
"""

from __future__ import annotations

import contextlib
import logging
import math
import mmap
import os

import torch

log = logging.getLogger(__name__)

_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # Linux's value before Python 3.13
HUGE_PAGES_FROM = 64 << 20
"""An array this large asks for huge pages (fewer TLB misses on random rows); smaller ones
do not, so many small tables do not each hold 2 MiB pages."""
_warned = False


def rows_in_memory(row_bytes: int) -> int:
    """How many rows of ``row_bytes`` this machine's memory holds (no table needs more)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // max(1, row_bytes)


def _strict_overcommit() -> bool:
    """Whether the kernel charges reservations in full (``vm.overcommit_memory`` 2), which
    ignores ``MAP_NORESERVE``: reserving would then take memory, not only addresses."""
    try:
        with open("/proc/sys/vm/overcommit_memory") as setting:
            return setting.read().strip() == "2"
    except OSError:
        return False


class ReservedRows:
    """An array of ``rows`` rows of shape ``row_shape`` and type ``dtype``, growable in place.

    Args:
        row_shape: the shape of one row (``()`` for one value per row, as versions).
        dtype: the values' type.
        rows: rows needed now.
        reserve: rows to reserve address space for (arrays indexed together pass the same).
    """

    def __init__(
        self, row_shape: tuple[int, ...], dtype: torch.dtype, rows: int, reserve: int
    ) -> None:
        self._row_shape, self._dtype = row_shape, dtype
        self._row_bytes = math.prod(row_shape) * torch.empty(0, dtype=dtype).element_size()
        self._region: mmap.mmap | None = None
        self._huge = False
        self.tensor = self._allocate(rows, max(rows, reserve))
        self._ask_for_huge_pages(rows)

    @property
    def capacity(self) -> int:
        """Rows the array holds without growing."""
        return len(self.tensor)

    def ensure(self, rows: int, used: int) -> None:
        """Make room for ``rows`` rows; the first ``used`` keep their values (copied only
        where the reservation ran out or was refused)."""
        self._ask_for_huge_pages(rows)
        if rows <= self.capacity:
            return
        capacity = max(1, self.capacity)
        while capacity < rows:
            capacity *= 2
        grown = self._allocate(capacity, capacity)
        self._ask_for_huge_pages(rows)  # before the copy touches its pages
        grown[:used] = self.tensor[:used]
        self.tensor = grown

    def _ask_for_huge_pages(self, rows: int) -> None:
        if self._huge or self._region is None or rows * self._row_bytes < HUGE_PAGES_FROM:
            return
        self._huge = True
        with contextlib.suppress(AttributeError, OSError):  # a hint only
            self._region.madvise(mmap.MADV_HUGEPAGE)

    def _allocate(self, rows: int, reserve: int) -> torch.Tensor:
        """A reservation of ``reserve`` rows, or else an ordinary array of ``rows``."""
        global _warned
        if not self._row_bytes:  # rows of no values take no memory
            return torch.empty((reserve, *self._row_shape), dtype=self._dtype)
        try:
            if _strict_overcommit():
                raise OSError("vm.overcommit_memory is 2: a reservation would be charged whole")
            region = mmap.mmap(
                -1,
                reserve * self._row_bytes,
                flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE,
                prot=mmap.PROT_READ | mmap.PROT_WRITE,
            )
            flat = torch.frombuffer(region, dtype=self._dtype)
            self._region, self._huge = region, False
        except (OSError, ValueError, OverflowError) as error:
            if not _warned:
                _warned = True
                log.warning(
                    "cannot reserve address space for row arrays (%s): they grow by doubling, "
                    "which needs twice a table's memory while it grows",
                    error,
                )
            flat = torch.empty(rows * math.prod(self._row_shape), dtype=self._dtype)
            self._region = None
        return flat.view(-1, *self._row_shape)
