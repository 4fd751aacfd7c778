"""ring: a distributed, replicated event log served over plain HTTP."""

__version__ = "0.1.0"
