"""The write-ahead log's files: replay order, group commit, rotation, torn and corrupt records."""

import logging
import threading

import pytest
from ember.ps_server.errors import DurableFileCorruptError
from ember.ps_server.write_log import WriteLog


def open_log(directory, fsync="always") -> WriteLog:
    log = WriteLog(directory, shard=1, num_shards=3, fsync=fsync)
    log.open()
    return log


def test_records_replay_in_order_across_segments_and_restarts(tmp_path):
    log = open_log(tmp_path)
    for n in range(5):
        log.sync(log.append(f"first-{n}".encode()))
    log.rotate()
    log.sync(log.append(b"second"))
    log.close()
    reopened = WriteLog(tmp_path, 1, 3)
    assert list(reopened.replay()) == [*(f"first-{n}".encode() for n in range(5)), b"second"]
    reopened.open()  # appends go to a new segment after the replayed ones
    reopened.sync(reopened.append(b"third"))
    reopened.close()
    assert list(WriteLog(tmp_path, 1, 3).replay())[-2:] == [b"second", b"third"]
    assert WriteLog(tmp_path, 1, 3).segments() == [1, 2, 3]
    assert list(WriteLog(tmp_path, 0, 3).replay()) == []  # another shard's log is separate


def test_a_record_appended_in_parts_reads_back_whole(tmp_path):
    log = open_log(tmp_path)
    log.sync(log.append([b"head-", memoryview(b"middle-"), bytearray(b"tail")]))
    log.sync(log.append(b""))
    log.close()
    assert list(WriteLog(tmp_path, 1, 3).replay()) == [b"head-middle-tail", b""]


def test_concurrent_appends_each_land_whole(tmp_path):
    log = open_log(tmp_path)

    def writer(worker: int) -> None:
        for n in range(200):
            log.sync(log.append(f"{worker}:{n}:".encode() * (n % 7 + 1)))

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    log.close()
    records = list(WriteLog(tmp_path, 1, 3).replay())
    assert len(records) == 1200
    for worker in range(6):  # each writer's records in its own order
        mine = [r for r in records if r.startswith(f"{worker}:".encode())]
        assert [int(r.split(b":")[1]) for r in mine] == list(range(200))


def test_a_checkpoint_base_drops_the_segments_it_covers(tmp_path):
    log = open_log(tmp_path)
    log.sync(log.append(b"before"))
    segment = log.rotate()
    log.sync(log.append(b"after"))
    log.commit_base(tmp_path / "ckpt-000001", segment)
    log.close()
    reopened = WriteLog(tmp_path, 1, 3)
    assert reopened.base() == (tmp_path / "ckpt-000001", segment)
    assert reopened.segments() == [segment] and list(reopened.replay()) == [b"after"]


@pytest.mark.parametrize("cut", [1, 5, 11, 14])
def test_a_torn_last_record_is_dropped_with_a_warning(tmp_path, caplog, cut):
    log = open_log(tmp_path)
    for payload in (b"one", b"two", b"three-torn"):
        log.sync(log.append(payload))
    log.close()
    (segment,) = tmp_path.glob("*.wal")
    data = segment.read_bytes()
    segment.write_bytes(data[: len(data) - cut])  # a crash in the middle of the last write
    with caplog.at_level(logging.WARNING):
        assert list(WriteLog(tmp_path, 1, 3).replay()) == [b"one", b"two"]
    assert "torn last record" in caplog.text and segment.name in caplog.text
    assert list(WriteLog(tmp_path, 1, 3).replay()) == [b"one", b"two"]  # cut off for good


def test_a_damaged_record_before_the_end_is_refused_naming_file_and_checksum(tmp_path):
    log = open_log(tmp_path)
    for payload in (b"alpha", b"bravo", b"charlie"):
        log.sync(log.append(payload))
    log.close()
    (segment,) = tmp_path.glob("*.wal")
    data = bytearray(segment.read_bytes())
    data[12 + 2] ^= 0x01  # a bit of the first payload
    segment.write_bytes(bytes(data))
    with pytest.raises(DurableFileCorruptError, match=rf"{segment.name}.*byte 0.*CRC-32"):
        list(WriteLog(tmp_path, 1, 3).replay())
    assert segment.read_bytes() == bytes(data)  # refused, not "repaired"


def test_a_missing_segment_is_refused(tmp_path):
    log = open_log(tmp_path)
    log.sync(log.append(b"a"))
    log.rotate()
    log.sync(log.append(b"b"))
    log.rotate()
    log.sync(log.append(b"c"))
    log.close()
    sorted(tmp_path.glob("*.wal"))[1].unlink()
    with pytest.raises(DurableFileCorruptError, match=r"00000002\.wal: missing"):
        list(WriteLog(tmp_path, 1, 3).replay())


def test_bad_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match="always"):
        WriteLog(tmp_path, 0, 1, fsync="sometimes")
    with pytest.raises(ValueError, match="interval"):
        WriteLog(tmp_path, 0, 1, fsync="interval", interval_s=0)
