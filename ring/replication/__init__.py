"""Replication: the protocol's pure decisions (protocol.py), the replica state beside each
partition log (replica.py), and the drivers that stream batches from leaders to followers
(leader.py, follower.py)."""
