"""`ring bench`: see ring.bench.run."""
from ring.bench.single import main

__all__ = ["main"]
