"""When one rank dies, the others exit within a minute with a message, instead of waiting out NCCL's timeout.

A blocked collective never returns when a peer is gone (NCCL waits 30 minutes by default), so each rank
runs a daemon thread that talks through the rendezvous store instead:
- it bumps its own heartbeat counter every `interval_s`, and watches the others' counters;
- a rank that fails with an exception writes its error to the store before exiting (`report_failure`);
- a rank that finishes normally marks itself done, so the others stop watching it.
A failure report, a heartbeat silent for `silent_after_s`, or a lost store (rank 0, which hosts it, is
gone) makes the thread print what happened and end the process (`os._exit`, since the main thread may be
stuck inside a collective). Heartbeats are read from the store only, never through the GPU.
"""

from __future__ import annotations

import os
import threading
import time

from nerfstudio.utils.rich_utils import CONSOLE
from rich.markup import escape

PREFIX = "bytesplat/watchdog"


class RankWatchdog(threading.Thread):
    def __init__(self, store, rank: int, world_size: int, interval_s: float = 2.0, silent_after_s: float = 40.0):
        super().__init__(name="bytesplat-rank-watchdog", daemon=True)
        self.store, self.rank, self.world_size = store, rank, world_size
        self.interval_s, self.silent_after_s = interval_s, silent_after_s
        self.stopped = threading.Event()

    def run(self) -> None:
        last_beat: dict[int, tuple[int, float]] = {}
        others = [r for r in range(self.world_size) if r != self.rank]
        while not self.stopped.wait(self.interval_s):
            try:
                self.store.add(f"{PREFIX}/beat/{self.rank}", 1)
                if self.store.check([f"{PREFIX}/failed"]):
                    failure = self.store.get(f"{PREFIX}/failed").decode()
                    if not failure.startswith(f"rank {self.rank} "):  # our own report: the main thread is exiting
                        self._exit(failure)
                now = time.monotonic()
                for other in others:
                    if self.store.check([f"{PREFIX}/done/{other}"]):
                        continue
                    beats = self.store.add(f"{PREFIX}/beat/{other}", 0)
                    seen, since = last_beat.get(other, (-1, now))
                    if beats != seen:
                        last_beat[other] = (beats, now)
                    elif now - since > self.silent_after_s:
                        self._exit(
                            f"rank {other} has sent no heartbeat for {now - since:.0f} s: it has died or hangs "
                            "(killed, out of host memory, or its machine is gone). See its output above."
                        )
            except Exception as error:  # the store lives in rank 0's process
                if self.stopped.is_set():
                    return
                self._exit(f"lost contact with rank 0 (it hosts the rendezvous store): {error}")

    def report_failure(self, message: str) -> None:
        """Tell the other ranks this rank is failing, so they exit now instead of after a timeout."""
        try:
            self.store.set(f"{PREFIX}/failed", f"rank {self.rank} failed: {message}")
        except Exception:
            pass  # the store is gone too: the others notice through their heartbeats

    def finish(self) -> None:
        """This rank ended normally: stop watching, and tell the others not to wait for its heartbeat."""
        self.stopped.set()
        try:
            self.store.set(f"{PREFIX}/done/{self.rank}", "1")
        except Exception:
            pass

    def _exit(self, why: str) -> None:
        if self.stopped.is_set():
            return
        CONSOLE.print(f"[bold red]bytesplat rank {self.rank}: stopping because {escape(why)}[/bold red]")
        os._exit(1)
