"""The write-ahead log's files: replay order, group commit, rotation, torn and corrupt records
(its behaviour under failing disks and fsyncs: test_write_log_faults.py)."""

import logging
import os
import subprocess
import sys
import threading
import zlib

import pytest
from ember.ps_server.durability import log_records
from ember.ps_server.durability.write_log import WriteLog
from ember.ps_server.errors import (
    DurableFileCorruptError,
    TopologyMismatchError,
    WriteLogLockedError,
)

from tests.support.write_logs import open_log


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
    heard = []
    log.on_append = heard.append
    log.sync(log.append(b"before"))
    segment = log.rotate()
    log.sync(log.append(b"after"))
    assert heard == [FRAMING + 6, 2 * FRAMING + 11] and log.bytes_since_base == heard[-1]
    log.commit_base(tmp_path / "ckpt-000001", segment)
    assert log.bytes_since_base == FRAMING + 5  # what a restart replays
    log.close()
    reopened = WriteLog(tmp_path, 1, 3)
    assert reopened.base() == (tmp_path / "ckpt-000001", segment)
    assert reopened.segments() == [segment] and list(reopened.replay()) == [b"after"]


HEADER = 16  # magic, length, payload CRC-32, header CRC-32
FRAMING = HEADER + 4  # and the trailer


def _three_records(directory):
    log = open_log(directory)
    for payload in (b"alpha", b"bravo-bravo", b"charlie:request-7"):
        log.sync(log.append(payload))
    log.close()
    (segment,) = directory.glob("*.wal")
    return segment, bytearray(segment.read_bytes())


def test_a_torn_last_record_of_every_length_is_dropped_with_a_warning(tmp_path, caplog):
    segment, data = _three_records(tmp_path)
    last = len(data) - (FRAMING + len(b"charlie:request-7"))
    for cut in range(last + 1, len(data)):  # a crash after any byte of the last append
        segment.write_bytes(bytes(data[:cut]))
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert list(WriteLog(tmp_path, 1, 3).replay()) == [b"alpha", b"bravo-bravo"]
        assert "torn last record" in caplog.text and f"byte {last}" in caplog.text
        assert segment.read_bytes() == bytes(data[:last])  # cut off for good


def test_a_last_record_whose_payload_never_reached_the_disk_is_dropped(tmp_path):
    """The file grew (header and length written) but the payload's blocks read back as zeros."""
    segment, data = _three_records(tmp_path)
    last = len(data) - (FRAMING + len(b"charlie:request-7"))
    data[last + HEADER :] = bytes(len(data) - last - HEADER)
    segment.write_bytes(bytes(data))
    assert list(WriteLog(tmp_path, 1, 3).replay()) == [b"alpha", b"bravo-bravo"]


@pytest.mark.parametrize("byte", range(HEADER))
def test_a_bit_flip_in_any_header_field_of_a_middle_record_stops_the_start(tmp_path, byte):
    segment, data = _three_records(tmp_path)
    middle = FRAMING + len(b"alpha")
    for bit in (0, 3, 7):  # flips make lengths smaller, larger and past the end of the file
        damaged = bytearray(data)
        damaged[middle + byte] ^= 1 << bit
        segment.write_bytes(bytes(damaged))
        with pytest.raises(
            DurableFileCorruptError, match=rf"{segment.name}: record at byte {middle}"
        ):
            list(WriteLog(tmp_path, 1, 3).replay())
        assert segment.read_bytes() == bytes(damaged)  # refused, not "repaired"


@pytest.mark.parametrize("byte", [4, 5, 8, 12, HEADER + 3, FRAMING + 16])
def test_a_damaged_but_whole_last_record_is_corruption_not_a_torn_tail(tmp_path, byte):
    """A flipped bit in the last record's length (past the end), CRCs, payload or trailer
    stops the start: a whole record on disk is not what a crash mid-append leaves."""
    segment, data = _three_records(tmp_path)
    last = len(data) - (FRAMING + len(b"charlie:request-7"))
    data[last + byte] ^= 0x10
    segment.write_bytes(bytes(data))
    with pytest.raises(DurableFileCorruptError, match=rf"record at byte {last}.*truncate"):
        list(WriteLog(tmp_path, 1, 3).replay())


def test_a_flipped_bit_in_a_last_record_whose_payload_ends_in_zeros_is_corruption(tmp_path):
    """An Assign record ends with its versions (little-endian int64: zero high bytes), so
    only the trailer keeps a whole record from ending in a zero block."""
    log = open_log(tmp_path)
    last = b"assign-versions" + bytes(7)
    # The first record's size puts a file block boundary 3 bytes into the last one's zeros.
    first = 4096 + 3 + len(log_records.TRAILER) - 2 * FRAMING - len(last)
    log.sync(log.append(b"f" * first))
    log.sync(log.append(last))
    log.close()
    (segment,) = tmp_path.glob("*.wal")
    data = bytearray(segment.read_bytes())
    assert len(data) == 4096 + 3 + 4 and data[4096:4099] == bytes(3)
    data[len(data) - FRAMING - len(last) + HEADER + 2] ^= 0x04  # early in the payload
    segment.write_bytes(bytes(data))
    with pytest.raises(DurableFileCorruptError, match="CRC-32"):
        list(WriteLog(tmp_path, 1, 3).replay())


def test_a_torn_record_whose_partial_payload_holds_a_whole_frame_is_still_torn(tmp_path):
    """Clients choose gradient bytes: a record cut short inside a payload that embeds an
    intact-looking frame is a torn tail (its intact header says how long it really is)."""
    log = open_log(tmp_path)
    log.sync(log.append(b"first"))
    embedded = log_records.header(5, zlib.crc32(b"fake!")) + b"fake!" + log_records.TRAILER
    log.sync(log.append(b"x" * 64 + embedded + b"y" * 64))
    log.close()
    (segment,) = tmp_path.glob("*.wal")
    data = segment.read_bytes()
    segment.write_bytes(data[: len(data) - 40])  # cut after the embedded frame
    assert list(WriteLog(tmp_path, 1, 3).replay()) == [b"first"]


def test_a_damaged_record_before_the_end_is_refused_naming_file_offset_and_checksum(tmp_path):
    segment, data = _three_records(tmp_path)
    data[HEADER + 2] ^= 0x01  # a bit of the first payload
    segment.write_bytes(bytes(data))
    with pytest.raises(
        DurableFileCorruptError, match=rf"{segment.name}: record at byte 0 .*CRC-32.*follows"
    ):
        list(WriteLog(tmp_path, 1, 3).replay())
    assert segment.read_bytes() == bytes(data)


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


def test_one_process_owns_a_log_and_a_dead_owner_does_not_block_the_next(tmp_path):
    program = (
        "import sys, pathlib; from ember.ps_server.durability.write_log import WriteLog; "
        f"log = WriteLog(pathlib.Path({str(tmp_path)!r}), 1, 3); log.claim(); "
        "print('held', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", program], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(WriteLogLockedError, match=rf"in use by pid {holder.pid} on host"):
            WriteLog(tmp_path, 1, 3).claim()
        WriteLog(tmp_path, 0, 3).claim()  # another shard's log is another lock
    finally:
        holder.kill()
        holder.wait()
    second = WriteLog(tmp_path, 1, 3)  # the holder died: its flock went with it
    second.claim()
    with pytest.raises(WriteLogLockedError, match=f"pid {os.getpid()}"):
        WriteLog(tmp_path, 1, 3).claim()  # even from the same process
    second.close()
    WriteLog(tmp_path, 1, 3).claim()


@pytest.mark.parametrize("file_name", ["shard-0-of-2.00000003.wal", "shard-1-of-2.base.json"])
def test_a_log_directory_of_another_shard_count_is_refused(tmp_path, file_name):
    (tmp_path / file_name).write_bytes(b"")
    log = WriteLog(tmp_path, 1, 3)
    with pytest.raises(TopologyMismatchError, match=rf"{file_name}.*shard 1 of 3.*--restore D"):
        log.claim()
    with pytest.raises(TopologyMismatchError):
        list(WriteLog(tmp_path, 0, 3).replay())
    WriteLog(tmp_path, 1, 2).claim()  # its own shard count is fine (the refusal left no lock)


def test_a_torn_record_whose_header_straddles_a_block_boundary_is_still_torn(tmp_path):
    """The header's first bytes shared a block with the previous record and were written;
    the rest of the file never was."""
    log = open_log(tmp_path)
    log.sync(log.append(b"p" * (4096 - 8 - FRAMING)))  # the next header starts 8 bytes short
    log.sync(log.append(b"torn" * 500))
    log.close()
    (segment,) = tmp_path.glob("*.wal")
    data = bytearray(segment.read_bytes())
    data[4096:] = bytes(len(data) - 4096)
    segment.write_bytes(bytes(data))
    assert list(WriteLog(tmp_path, 1, 3).replay()) == [b"p" * (4096 - 8 - FRAMING)]
    assert segment.stat().st_size == 4096 - 8


def test_a_log_of_the_previous_format_is_refused_saying_so(tmp_path):
    (tmp_path / "shard-1-of-3.00000001.wal").write_bytes(b"EMWL" + bytes(8) + b"payload")
    with pytest.raises(DurableFileCorruptError, match="previous log format"):
        list(WriteLog(tmp_path, 1, 3).replay())
