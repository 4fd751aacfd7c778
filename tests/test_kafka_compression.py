"""Compressed RecordBatch v2 on the Kafka listener: snappy (raw and xerial-framed), lz4 and zstd as
real clients encode them, stored as ring's records and read back identical over Kafka and HTTP; and
hostile batches (bombs past the inflate bound, truncated frames, an unknown codec id) refused with
Kafka's error codes, nothing stored, the broker's memory bounded by the limit."""

from __future__ import annotations

import struct

import cramjam
import lz4.frame
import pytest
import zstandard
from crc32c import crc32c

from ring import limits
from ring.kafka_api import records
from tests.rss_consume import vm_kib
from tests.test_kafka_listener import (assert_stored, connect, consume_confluent, high_watermark, produce_answer,
                                       produce_frame, produce_keyed, read_answer)

CORRUPT_MESSAGE, MESSAGE_TOO_LARGE, UNSUPPORTED_COMPRESSION_TYPE = 2, 10, 76
SNAPPY, LZ4, ZSTD = 2, 3, 4


def sent_records() -> list[tuple]:
    return [(1_700_000_000_000 + i, None if i % 7 == 0 else b"k%d" % i, None if i % 5 == 4 else b"v" * (i % 300),
             [("h", b"%d" % i), ("h", None)]) for i in range(200)]


def kafka_python_batch(codec: int) -> bytes:
    """A batch of ``sent_records`` as kafka-python's producer builds it."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i, (ts, key, value, headers) in enumerate(sent_records()):
        assert b.append(i, timestamp=ts, key=key, value=value, headers=headers) is not None
    return bytes(b.build())


def batch_around(codec: int, body: bytes, count: int = 1) -> bytes:
    """A RecordBatch v2 header (right CRC) around ``body`` as it is, claiming ``codec``."""
    buf = bytearray(records.HEADER_SIZE)
    base_ts = sent_records()[0][0]  # the timestamp ``plain_body``'s deltas count from
    records.HEADER.pack_into(buf, 0, 0, records.HEADER_SIZE - 12 + len(body), 0, 2, 0, codec, count - 1,
                             base_ts, base_ts, -1, -1, -1, count)
    buf += body
    struct.pack_into(">I", buf, 17, crc32c(memoryview(buf)[21:]))
    return bytes(buf)


def xerial(raw: bytes, block: int = 32 * 1024) -> bytes:
    """``raw`` in snappy-java's SnappyOutputStream framing, as Kafka's Java producer writes it."""
    out = [b"\x82SNAPPY\x00", struct.pack(">ii", 1, 1)]
    for i in range(0, len(raw), block):
        c = bytes(cramjam.snappy.compress_raw(raw[i:i + block]))
        out += [struct.pack(">i", len(c)), c]
    return b"".join(out)


def plain_body(rs: list[tuple]) -> bytes:
    return bytes(records.encode_batch(0, 0, rs)[records.HEADER_SIZE:])


def as_read(rs: list[tuple]) -> list[tuple]:
    return [(i, ts, key, value, headers) for i, (ts, key, value, headers) in enumerate(rs)]


@pytest.mark.parametrize("codec", [LZ4, ZSTD])
def test_kafka_python_batches_decode_to_the_records_sent(codec):
    got = records.decode_batches(kafka_python_batch(codec))
    assert [tuple(r) for r in got] == as_read(sent_records())


@pytest.mark.parametrize("frame", [lambda b: bytes(cramjam.snappy.compress_raw(b)), xerial], ids=["raw", "xerial"])
def test_snappy_raw_and_xerial_framed_decode_alike(frame):
    body = plain_body(sent_records())
    got = records.decode_batches(batch_around(SNAPPY, frame(body), count=200))
    assert [tuple(r) for r in got] == as_read(sent_records())


# --- on a broker -----------------------------------------------------------------------------




def bombs() -> dict[str, tuple[int, bytes]]:
    """Batches that inflate (or claim to) past what one request may: 4x the request bound of zeros."""
    zeros = bytes(4 * limits.REQUEST_BYTES_MAX)
    claim = cramjam.snappy.compress_raw(b"\x00" * 1000)
    lying = b"\x80\x80\x80\x80\x04" + bytes(claim)[2:]  # a raw snappy block claiming 1 GiB
    return {
        "zstd": (ZSTD, zstandard.ZstdCompressor(level=1, write_content_size=False).compress(zeros)),
        "lz4": (LZ4, lz4.frame.compress(zeros)),
        "snappy-xerial": (SNAPPY, xerial(zeros, block=1 << 20)),
        "snappy-claim": (SNAPPY, lying),
    }


@pytest.mark.integration
def test_bombs_truncations_and_unknown_codecs_are_refused_with_memory_bounded(kafka):
    """Runs first on its broker, so the peak RSS it measures is its own."""
    assert kafka.http.create_topic("hostile", partitions=1).status == 201
    body = plain_body(sent_records())
    hostile = {name: (codec, data, MESSAGE_TOO_LARGE) for name, (codec, data) in bombs().items()}
    hostile |= {
        "zstd-truncated": (ZSTD, zstandard.ZstdCompressor().compress(body)[:-9], CORRUPT_MESSAGE),
        "lz4-truncated": (LZ4, lz4.frame.compress(body)[:-9], CORRUPT_MESSAGE),
        "snappy-truncated": (SNAPPY, xerial(body)[:-9], CORRUPT_MESSAGE),
        "snappy-raw-truncated": (SNAPPY, bytes(cramjam.snappy.compress_raw(body))[:-9], CORRUPT_MESSAGE),
        "codec-5": (5, body, UNSUPPORTED_COMPRESSION_TYPE),
        "codec-7": (7, body, UNSUPPORTED_COMPRESSION_TYPE),
    }
    before_kib = vm_kib(kafka.pid, "VmHWM")
    with connect(kafka) as s:
        for i, (name, (codec, data, error)) in enumerate(hostile.items()):
            s.sendall(produce_frame(i, "hostile", 0, batch_around(codec, data, count=200)))
            corr, answer = read_answer(s)
            assert (corr, produce_answer(answer)[0]) == (i, error), name
        # the connection still serves: a good zstd batch lands
        s.sendall(produce_frame(99, "hostile", 0, batch_around(ZSTD, zstandard.ZstdCompressor().compress(body), 200)))
        assert produce_answer(read_answer(s)[1]) == (0, 0)
    grown_mib = (vm_kib(kafka.pid, "VmHWM") - before_kib) / 1024
    print(f"broker peak RSS grew {grown_mib:.1f} MiB over {len(hostile)} hostile batches")
    assert grown_mib < 4 * limits.REQUEST_BYTES_MAX / 2**20  # bounded by the limit, not by 64 MiB per bomb
    assert high_watermark(kafka, "hostile", 0) == 200  # only the good batch


@pytest.mark.integration
@pytest.mark.parametrize("codec", ["snappy", "lz4", "zstd", "gzip"])
def test_confluent_producers_compressed_read_back_identical_over_kafka_and_http(kafka, codec):
    topic = f"compressed-{codec}"
    assert kafka.http.create_topic(topic, partitions=2).status == 201
    landed = produce_keyed(kafka.bootstrap, topic, 150, **{"compression.type": codec})
    assert consume_confluent(kafka.bootstrap, topic, 2, 150) == landed
    assert_stored(kafka, topic, 2, landed)
