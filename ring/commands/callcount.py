"""An opt-in count of the Python function calls a broker process makes, for ``ring bench --cases cpu``.

Calls per request are a figure noise cannot move (CPU seconds on a shared
machine can), so the bench reads it beside its timings. ``ring serve`` looks
at ``RING_CALL_COUNT_FILE`` once at startup: unset (always, outside the
bench), nothing is installed and the request path is untouched. Set, a
profile function counts every ``call`` event (Python functions, not C
builtins) of the event loop's thread and of threads started later, and each
SIGUSR2 writes ``<snapshot number> <calls so far>`` to that file; the bench
reads two snapshots around N requests and divides by N.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

ENV = "RING_CALL_COUNT_FILE"


class CallCounter:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.calls = 0
        self.snapshots = 0

    def _profile(self, frame, event: str, arg) -> None:
        if event == "call":
            self.calls += 1

    def install(self, loop) -> None:
        sys.setprofile(self._profile)
        threading.setprofile(self._profile)
        loop.add_signal_handler(signal.SIGUSR2, self.write)

    def write(self) -> None:
        self.snapshots += 1
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{self.snapshots} {self.calls}\n")
        os.replace(tmp, self.path)  # the reader sees a whole line or the previous one


def install_if_asked(loop) -> CallCounter | None:
    """Install the counter when ``RING_CALL_COUNT_FILE`` names a file; called once, at startup."""
    path = os.environ.get(ENV)
    if not path:
        return None
    counter = CallCounter(Path(path))
    counter.install(loop)
    return counter
