"""One shard process: the gRPC service, tables, step clocks and the write gate."""
