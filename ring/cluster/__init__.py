"""The cluster: membership by gossip (membership.py), placement on the token ring
(placement.py), requests between brokers (peers.py), and the clustered broker that
ties them to the log and replication (node.py)."""
