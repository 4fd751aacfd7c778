"""The records every benchmarked system gets: 1 KiB JSON page views, and the sequence number a
latency run writes into each to find its send time."""

from __future__ import annotations

import random

import orjson

from ring import clickstream

RECORD_BYTES = 1024
POOL_RECORDS = 2_000  # distinct records reused in rotation: realistic content without per-request generation
SEQ_DIGITS = 10


def make_records(n: int = POOL_RECORDS, seed: int = 1) -> list[tuple[bytes, bytes]]:
    """(key, value) pairs: 1 KiB JSON page views keyed by their user."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        value = clickstream.padded_record(rng, RECORD_BYTES)
        out.append((orjson.loads(value)["user"].encode(), value))
    return out


def with_seq(value: bytes, seq: int) -> bytes:
    """The record with a sequence number written over the end of its padding
    (still valid JSON, still 1 KiB): how e2e finds a record's send time."""
    assert value.endswith(b'"}')
    return value[: -2 - SEQ_DIGITS] + b"%0*d" % (SEQ_DIGITS, seq) + b'"}'


def seq_of(value: bytes) -> int:
    return int(value[-2 - SEQ_DIGITS : -2])
