"""The group admin APIs' bodies (ring.kafka_api.group_codec: ListGroups, DescribeGroups, DeleteGroups) against
kafka-python's own protocol classes: every request a client sends at every served version parses to what it
said, every answer built here decodes in the client to what was meant, and a body that lies about its
lengths is ``Malformed`` (the listener closes the connection) rather than anything worse."""

from __future__ import annotations

import pytest
from kafka.protocol.admin import (DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest,
                                  DescribeGroupsResponse, ListGroupsRequest, ListGroupsResponse)

from ring.kafka_api import apis
from ring.kafka_api import group_codec as gc
from ring.kafka_api.wire import Malformed, Reader
from tests.test_kafka_group_codec import parsed, versions


@pytest.mark.parametrize("version", versions(gc.LIST_GROUPS))
def test_list_groups(version):
    assert bytes(ListGroupsRequest().encode(version=version)) == b""  # no fields before v4
    body = gc.list_groups_answer(version, 0, [("billing", "consumer"), ("audit", "ring"), ("old", "")])
    answer = ListGroupsResponse.decode(body, version=version)
    assert answer.error_code == 0
    assert [(g.group_id, g.protocol_type) for g in answer.groups] == [
        ("billing", "consumer"), ("audit", "ring"), ("old", "")]


@pytest.mark.parametrize("version", versions(gc.DESCRIBE_GROUPS))
def test_describe_groups(version):
    req = DescribeGroupsRequest(groups=["billing", "gone"], include_authorized_operations=True)
    assert parsed(gc.read_describe_groups, version, req) == gc.DescribeGroups(["billing", "gone"], version >= 3)
    body = gc.describe_groups_answer(version, [
        gc.DescribedGroup(0, "billing", "Stable", "consumer", "range",
                          [("m-1", "client-1", "", b"\x00\x00meta", b"\x00\x00assigned")]),
        gc.DescribedGroup(0, "gone", "Dead", "", "", []),
        gc.DescribedGroup(16, "elsewhere", "", "", "", [])])
    answer = DescribeGroupsResponse.decode(body, version=version)
    assert [(g.error_code, g.group_id, g.group_state, g.protocol_type, g.protocol_data) for g in answer.groups] == [
        (0, "billing", "Stable", "consumer", "range"), (0, "gone", "Dead", "", ""), (16, "elsewhere", "", "", "")]
    [m] = answer.groups[0].members
    assert (m.member_id, m.client_id, m.client_host, m.member_metadata, m.member_assignment) == (
        "m-1", "client-1", "", b"\x00\x00meta", b"\x00\x00assigned")
    if version >= 3:
        assert answer.groups[0].authorized_operations is None  # the client reads INT32_MIN as "not given"


@pytest.mark.parametrize("version", versions(gc.DELETE_GROUPS))
def test_delete_groups(version):
    req = DeleteGroupsRequest(groups_names=["billing", "busy"])
    assert parsed(gc.read_delete_groups, version, req) == ["billing", "busy"]
    answer = DeleteGroupsResponse.decode(gc.delete_groups_answer(version, [("billing", 0), ("busy", 68)]),
                                         version=version)
    assert [(r.group_id, r.error_code) for r in answer.results] == [("billing", 0), ("busy", 68)]


def test_the_served_versions_are_the_non_flexible_ones():
    for api in (gc.LIST_GROUPS, gc.DESCRIBE_GROUPS, gc.DELETE_GROUPS):
        low, high = apis.SERVED[api][:2]
        assert (low, high) == gc.VERSIONS[api]
        assert not apis.flexible(api, high) and apis.flexible(api, high + 1)


def test_admin_bodies_that_lie_about_their_lengths_are_malformed():
    body = bytes(DescribeGroupsRequest(groups=["billing"], include_authorized_operations=True).encode(version=4))
    with pytest.raises(Malformed):
        gc.read_describe_groups(4, Reader(body[:-1]))  # the flag is missing
    with pytest.raises(Malformed):
        gc.read_describe_groups(0, Reader(b"\x00\x00\x00\x01\x00\x09bill"))  # a name longer than what follows
    with pytest.raises(Malformed):
        gc.read_delete_groups(1, Reader(b"\x7f\xff\xff\xff"))  # two billion names in no bytes
    with pytest.raises(Malformed):
        gc.read_delete_groups(0, Reader(b"\x00\x00\x00\x01\xff"))  # half a string length
