"""What a shard's data survives: write-ahead log, checkpoints, recovery, the fault latch."""
