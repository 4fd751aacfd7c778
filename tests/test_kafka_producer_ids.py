"""InitProducerId's bodies (ring.kafka_api.producer_ids) against kafka-python's own protocol classes, and
Kafka's producer id and epoch folded into ring's stored producer id and back."""

from __future__ import annotations

import random

import pytest
from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse

from ring.kafka_api import errors, producer_ids
from ring.kafka_api.wire import Reader


class _Broker:
    rng = random.Random(7)


@pytest.mark.parametrize("version", range(producer_ids.VERSIONS[0], producer_ids.VERSIONS[1] + 1))
def test_init_producer_id_hands_out_a_new_id_at_epoch_0(version):
    fields = {"producer_id": 12, "producer_epoch": 3} if version >= 3 else {}
    body = bytes(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60_000, **fields)
                 .encode(version=version))
    r = Reader(body)
    assert producer_ids.read_request(version, r) == (None, 60_000, *((12, 3) if version >= 3 else (-1, -1)))
    assert r.left == 0, "the whole body was read"
    answers = [InitProducerIdResponse.decode(producer_ids.handle(_Broker, version, Reader(body)), version=version)
               for _ in range(2)]
    for a in answers:
        assert (a.error_code, a.producer_epoch, a.throttle_time_ms) == (0, 0, 0)
        assert 0 <= a.producer_id < 1 << producer_ids.ID_BITS
    assert answers[0].producer_id != answers[1].producer_id  # a bump (v3+ naming its id) gets a new id too


@pytest.mark.parametrize("version", [0, 2, 5])
def test_a_transactional_id_is_refused_with_the_fatal_authorization_code(version):
    body = bytes(InitProducerIdRequest(transactional_id="tx-1", transaction_timeout_ms=60_000)
                 .encode(version=version))
    a = InitProducerIdResponse.decode(producer_ids.handle(_Broker, version, Reader(body)), version=version)
    assert (a.error_code, a.producer_id, a.producer_epoch) == (errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, -1)


def test_fold_keeps_id_and_epoch_apart_and_non_negative():
    top = (1 << producer_ids.ID_BITS) - 1
    for pid, epoch in [(0, 0), (0, 1), (1, 0), (top, producer_ids.EPOCH_MAX), (123_456, 32_767)]:
        stored = producer_ids.fold(pid, epoch)
        assert 0 <= stored < 1 << 63 and producer_ids.unfold(stored) == (pid, epoch)
    assert producer_ids.fold(5, 1) != producer_ids.fold(5, 0)  # a bumped epoch is another producer to ring
    assert producer_ids.unfold(-1) == (-1, -1)


def test_errors_a_forwarded_produce_met_get_the_codes_their_classes_would():
    """A produce forwarded to the leader comes back with the leader's error as ``Relayed`` (its code name and
    fields): a client must see the retriable or out-of-order code, not UNKNOWN_SERVER_ERROR."""
    from ring.cluster.peers import Relayed
    from ring.errors import NotLeader, Unavailable

    gap = Relayed(409, {"error": "conflict", "message": "m", "reason": "out_of_order_sequence", "producer_id": 1},
                  None)
    assert errors.code_of(gap) == errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    for cls in (NotLeader, Unavailable):
        assert errors.code_of(Relayed(503, {"error": cls.code, "message": "m"}, None)) == (
            errors.NOT_LEADER_OR_FOLLOWER)
    assert errors.code_of(Relayed(504, {"error": "timeout", "message": "m"}, None)) == errors.REQUEST_TIMED_OUT
    assert errors.code_of(Relayed(500, {"error": "internal", "message": "m"}, None)) == errors.UNKNOWN_SERVER_ERROR
