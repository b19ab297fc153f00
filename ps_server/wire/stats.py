"""What a shard reports about its tables (the Stats RPC), on both sides of the wire."""

from __future__ import annotations

import dataclasses

from ember.ps_server.wire.messages import pb


@dataclasses.dataclass
class TableCounters:
    """Traffic counters of one table on one shard."""

    pull_requests: int = 0
    push_requests: int = 0
    rows_pulled: int = 0
    rows_pushed: int = 0
    duplicate_pushes: int = 0


@dataclasses.dataclass(frozen=True)
class TableStats:
    """Size and traffic of one table on one shard."""

    name: str
    dim: int
    rows: int
    bytes: int
    counters: TableCounters

    def to_proto(self) -> pb.TableStats:
        """The message the Stats RPC carries."""
        return pb.TableStats(
            name=self.name,
            dim=self.dim,
            rows=self.rows,
            bytes=self.bytes,
            **dataclasses.asdict(self.counters),
        )

    @classmethod
    def from_proto(cls, message: pb.TableStats) -> TableStats:
        """The stats ``message`` carries."""
        counters = TableCounters(
            **{
                field.name: getattr(message, field.name)
                for field in dataclasses.fields(TableCounters)
            }
        )
        return cls(message.name, message.dim, message.rows, message.bytes, counters)
