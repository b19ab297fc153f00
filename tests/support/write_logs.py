"""Opening a write-ahead log as the log's tests do."""

from ember.ps_server.durability.write_log import WriteLog


def open_log(directory, fsync: str = "always") -> WriteLog:
    """Shard 1 of 3's log in ``directory``, opened for appending."""
    log = WriteLog(directory, shard=1, num_shards=3, fsync=fsync)
    log.open()
    return log
