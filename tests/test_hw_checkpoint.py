"""The high-watermark checkpoint (``ring.cluster.checkpoints``): the broker's periodic save writes its file
in an executor thread, off the event loop; saves are taken one at a time and an older snapshot never
replaces a newer one's file, whichever thread writes last."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from ring.cluster import checkpoints
from ring.cluster.checkpoints import HighWatermarks
from ring.cluster.node import ClusterBroker


def test_an_older_snapshot_never_replaces_a_newer_ones_file(tmp_path: Path) -> None:
    hws = HighWatermarks(tmp_path)
    older = hws.snapshot({("t", 0): 5})
    newer = hws.snapshot({("t", 0): 9})
    hws.save(newer)
    hws.save(older)  # (a thread that took its snapshot first and wrote last)
    assert HighWatermarks(tmp_path).load() == {("t", 0): 9}
    hws.save(hws.snapshot({("t", 0): 12, ("u", 3): 1}))
    assert HighWatermarks(tmp_path).load() == {("t", 0): 12, ("u", 3): 1}


def test_saves_from_two_threads_are_taken_one_at_a_time(tmp_path: Path, monkeypatch) -> None:
    hws = HighWatermarks(tmp_path)
    inside, most = [0], [0]
    real = checkpoints.write_atomically

    def write(path: Path, data: bytes) -> None:
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        try:
            threading.Event().wait(0.01)  # (a slow fsync: long enough for the other thread to come in)
            real(path, data)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(checkpoints, "write_atomically", write)
    snaps = [hws.snapshot({("t", 0): n}) for n in range(1, 9)]
    threads = [threading.Thread(target=hws.save, args=(s,)) for s in snaps]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1
    assert HighWatermarks(tmp_path).load() == {("t", 0): 8}


async def test_the_periodic_save_writes_in_an_executor_thread_not_on_the_loop(tmp_path: Path, monkeypatch) -> None:
    writers: list[threading.Thread] = []
    monkeypatch.setattr(checkpoints, "write_atomically", lambda path, data: writers.append(threading.current_thread()))

    class Clock:
        sleeps = 0

        async def sleep(self, seconds: float) -> None:
            Clock.sleeps += 1
            if Clock.sleeps > 2:
                raise asyncio.CancelledError

    hw = {("t", 0): 3}
    node = SimpleNamespace(clock=Clock(), _hws=HighWatermarks(tmp_path),
                           _parts={"t": {0: SimpleNamespace(hw=3, rf=3)}, "solo": {0: SimpleNamespace(hw=4, rf=1)}})
    node._hw_snapshot = lambda: ClusterBroker._hw_snapshot(node)
    node._save_hws = lambda: ClusterBroker._save_hws(node)  # (what a save on the loop would call)
    with pytest.raises(asyncio.CancelledError):
        await ClusterBroker._hw_checkpoint_loop(node)
    assert writers and threading.main_thread() not in writers
    assert node._hws.saved == hw  # (a partition of one replica is not checkpointed)
