"""The parameter server, by side.

- ``wire``: the contract both sides speak (messages, codecs, table specs, stats).
- ``client``: what trainers and tools import to talk to shards.
- ``shard``: one shard process (service, tables, step clocks).
- ``stores``: where a shard's rows live (memory, Redis, tiered).
- ``durability``: write-ahead log, checkpoints, recovery, the fault latch.

``errors``, ``id_arrays`` and ``routing`` are shared by both sides.
"""
