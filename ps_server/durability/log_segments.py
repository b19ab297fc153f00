"""LogSegments: the files of one shard's write-ahead log, named, listed and read in order.

In ``directory``: segments ``shard-S-of-N.<8 digits>.wal`` (records, see
:mod:`log_records`) and ``shard-S-of-N.base.json``, which names the last
committed checkpoint and the first segment after it. :class:`WriteLog` appends
to the newest segment; this class knows the layout: which files exist, what a
restart reads and in which order, and which files a checkpoint makes obsolete.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

from ember.ps_server.durability.durable_files import fsync_directory, write_durably
from ember.ps_server.durability.log_records import segment_records
from ember.ps_server.errors import DurableFileCorruptError


class LogSegments:
    """The log files of shard ``shard`` of ``num_shards`` in ``directory``."""

    def __init__(self, directory: Path, shard: int, num_shards: int) -> None:
        self.directory = directory
        self._prefix = f"shard-{shard}-of-{num_shards}"
        self._pattern = re.compile(rf"^{re.escape(self._prefix)}\.(\d{{8}})\.wal$")

    @property
    def base_path(self) -> Path:
        """Where the last committed checkpoint of this shard is recorded."""
        return self.directory / f"{self._prefix}.base.json"

    def base(self) -> tuple[Path | None, int]:
        """``(checkpoint directory, first segment after it)``; ``(None, 1)`` without one.

        Raises:
            DurableFileCorruptError: the base file cannot be read.
        """
        if not self.base_path.exists():
            return None, 1
        try:
            record = json.loads(self.base_path.read_bytes())
            return Path(record["checkpoint"]), int(record["segment"])
        except (ValueError, KeyError, TypeError) as error:
            raise DurableFileCorruptError(f"{self.base_path}: unreadable ({error})") from error

    def write_base(self, checkpoint: Path, segment: int) -> None:
        """Record ``checkpoint`` and the first segment after it, durably."""
        write_durably(
            self.base_path,
            json.dumps({"checkpoint": str(checkpoint), "segment": segment}).encode(),
        )

    def numbers(self) -> list[int]:
        """Numbers of the segment files present, ascending."""
        return sorted(
            int(match.group(1))
            for entry in self.directory.iterdir()
            if (match := self._pattern.match(entry.name))
        )

    def path(self, number: int) -> Path:
        """Segment ``number``'s file."""
        return self.directory / f"{self._prefix}.{number:08d}.wal"

    def bytes_from(self, first: int) -> int:
        """Bytes in the segments numbered ``first`` or later."""
        return sum(self.path(n).stat().st_size for n in self.numbers() if n >= first)

    def records(self, first: int) -> Iterator[bytes]:
        """Every record payload of the segments from ``first`` on, in order; a torn last
        record of the last segment is cut off, with a warning.

        Raises:
            DurableFileCorruptError: a segment from ``first`` on is missing, or a record
                fails its checks anywhere but as a torn tail of the last segment.
        """
        segments = [n for n in self.numbers() if n >= first]
        if segments and segments[0] != first:
            raise DurableFileCorruptError(
                f"{self.path(first)}: missing (the log continues at segment "
                f"{segments[0]}); records in between are lost"
            )
        for position, number in enumerate(segments):
            if number != first + position:
                raise DurableFileCorruptError(f"{self.path(first + position)}: missing")
            yield from segment_records(self.path(number), position == len(segments) - 1)

    def drop_before(self, segment: int) -> None:
        """Delete the segments numbered below ``segment``, durably."""
        for number in self.numbers():
            if number < segment:
                self.path(number).unlink()
        fsync_directory(self.directory)
