"""The segmented append-only log of one partition replica (see partition.py)."""
