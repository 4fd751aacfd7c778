"""Consumer groups: a coordinator per group, committed offsets in the replicated ``__offsets`` topic.

Pure cores: sticky assignment (assignment.py), one group's state machine of
members, generations and offsets (group.py), the offsets topic's record format
(codec.py), the groups of one offsets partition with replay and
checkpoints (shard.py), when an ``auto`` topic should grow (autogrow.py), and Kafka's classic
membership of a group (classic.py). Drivers: the coordinator that loads shards from the
log and persists changes (driver.py), reading records for group polls
(poller.py), the operations the HTTP layer calls (service.py), and those Kafka's group
APIs call (membership.py).
"""
