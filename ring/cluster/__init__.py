"""The cluster: membership by gossip (membership.py), requests between brokers (peers.py), the
replication links' drivers (leader.py, follower.py), and the clustered broker that ties them to
the log and replication (node.py); placement on the token ring is the node core's
(``ring.node.placement``), the leadership claims in gossip are gossip's (``ring.gossip.leaders``)."""
