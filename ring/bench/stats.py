"""The arithmetic of the benchmark: percentiles, medians over repetitions,
ratios against a peer, and the rule that flags a run as disturbed.

Pure functions over numbers, so the tests can check them without starting
anything. A run is *disturbed* when processes that take no part in it (other
users of this shared machine, idle peers, test suites) used a noticeable share
of the CPU while it ran: its figure is then a lower bound, and the report says
so beside it.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

# Other processes may use this much CPU (in cores, averaged over the run)
# before a run is flagged: an idle peer cluster and the kernel stay under it,
# a test suite or a build on the other core does not.
OTHERS_CORES_FLAG = 0.35


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of already sorted values, nearest rank; None when empty."""
    assert 0.0 <= q <= 1.0, q
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return float(sorted_values[rank - 1])


def latency_summary(latencies_ms: Iterable[float]) -> dict[str, float | int | None]:
    """p50/p99/p999 and max of latencies in milliseconds, with the sample count."""
    values = sorted(latencies_ms)
    return {
        "n": len(values),
        "p50": percentile(values, 0.50),
        "p99": percentile(values, 0.99),
        "p999": percentile(values, 0.999),
        "max": float(values[-1]) if values else None,
    }


def median(values: Iterable[float | None]) -> float | None:
    """Median of the values that are not None; None when there are none."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    mid = len(vals) // 2
    return float(vals[mid]) if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2.0


def ratio(ours: float | None, theirs: float | None) -> float | None:
    """ours / theirs, None when either is missing or theirs is zero."""
    if ours is None or theirs is None or theirs == 0:
        return None
    return ours / theirs


def others_cores(total_busy_s: float, participants_s: float, wall_s: float) -> float:
    """Average cores used by processes outside the run: all busy CPU time of the
    machine minus the participants' own, over the run's wall time."""
    if wall_s <= 0:
        return 0.0
    return max(0.0, total_busy_s - participants_s) / wall_s


def disturbed(others: float, threshold_cores: float = OTHERS_CORES_FLAG) -> bool:
    return others > threshold_cores


def meets(value: float | None, target: float, higher_is_better: bool = True) -> bool | None:
    """Whether a figure meets its target; None when there is no figure."""
    if value is None:
        return None
    return value >= target if higher_is_better else value <= target
