"""Replication: the protocol's pure decisions (protocol.py), the replica state beside each
partition log (replica.py), and a partition's produces, reads and durability (intake.py,
appends.py, commit.py, reads.py). The drivers that stream batches from leaders to followers are
the cluster's (``ring.cluster.leader``, ``ring.cluster.follower``)."""
