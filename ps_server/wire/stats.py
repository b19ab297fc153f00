"""What a shard reports about itself (the Stats RPC): its tables and its data planes."""

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


@dataclasses.dataclass(frozen=True)
class DataPlaneAddress:
    """A data plane a shard serves beside gRPC.

    Attributes:
        transport: its kind (``ucx``).
        host: where to reach it ('' : the host of the shard's gRPC endpoint).
        port: its port.
        max_message_bytes: the largest request message it takes (0: not said), so that
            a client refuses a larger one itself, as gRPC's limit would.
    """

    transport: str
    host: str
    port: int
    max_message_bytes: int = 0

    def to_proto(self) -> pb.DataPlane:
        """The message the Stats RPC carries."""
        return pb.DataPlane(
            transport=self.transport, host=self.host, port=self.port,
            max_message_bytes=self.max_message_bytes,
        )  # fmt: skip

    @classmethod
    def from_proto(cls, message: pb.DataPlane) -> DataPlaneAddress:
        """The address ``message`` carries."""
        return cls(message.transport, message.host, message.port, message.max_message_bytes)


@dataclasses.dataclass(frozen=True)
class ShardStats:
    """What one shard reports about itself."""

    endpoint: str
    shard: int
    num_shards: int
    tables: list[TableStats]
    data_planes: list[DataPlaneAddress] = dataclasses.field(default_factory=list)

    @classmethod
    def from_proto(cls, endpoint: str, reply: pb.StatsResponse) -> ShardStats:
        """The stats of the shard at ``endpoint`` from its Stats reply."""
        tables = [TableStats.from_proto(t) for t in reply.tables]
        planes = [DataPlaneAddress.from_proto(plane) for plane in reply.data_planes]
        return cls(endpoint, reply.shard, reply.num_shards, tables, planes)
