"""Replica repair: where a returning replica's log diverges from its leader's (divergence.py), and
anti-entropy, which compares committed ranges of replicas by checksum and refetches damaged ones
(entropy.py for the decisions, driver.py for the loop)."""
