"""Replica repair: where a returning replica's log diverges from its leader's (divergence.py),
anti-entropy, which compares committed ranges of replicas by checksum (entropy.py for the decisions,
driver.py for the loop), and mending a damaged batch in place from another replica's whole copy
(mend.py)."""
