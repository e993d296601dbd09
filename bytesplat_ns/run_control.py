"""Pause and stop requests that every rank obeys at the same step.

Only rank 0 has the viewer, but a rank that pauses or stops alone leaves the others blocked in the next
gradient exchange. So a request (the viewer's pause/resume on rank 0, Ctrl-C or SIGTERM on any rank) is
only a wish until the ranks agree on it:
- while training, each rank sends its wish as the `note` of the gradient exchange it already makes every
  step (no extra round trip); the exchange hands every rank's notes back a few steps later (it never makes the
  host wait for them), all ranks take the strongest wish (stop > pause > train) and act on it at the top of
  the next step, together;
- while paused, no exchange runs: rank 0 publishes resume or stop in the rendezvous store, and the other
  ranks poll it (each poll is one store read, only while paused).
A note carries the number of resumes its rank had seen, so the notes of the steps before a pause, handed
back after the resume, are recognised as stale and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KEY = "bytesplat/run_control"
PAUSE, STOP = 1, 2
WISHES = 4
"""note = wish + WISHES * resumes."""


@dataclass
class RunControl:
    store: object | None = field(repr=False)
    """torch.distributed Store shared by the ranks (the default process group's)."""
    rank: int = 0
    requested_state: str = "training"
    """This rank's wish: "training" or "paused" (rank 0's viewer), or "completed" at the end."""
    requested_stop: bool = False
    """This rank was asked to stop (Ctrl-C, SIGTERM, the viewer)."""
    agreed_state: str = "training"
    agreed_stop: bool = False
    resumes: int = 0

    def note(self) -> int:
        """This rank's wish as a number for the exchange."""
        wish = STOP if self.requested_stop else PAUSE if self.requested_state == "paused" else 0
        return wish + WISHES * self.resumes

    def agree(self, notes: list[int]) -> None:
        """Every rank's note, from the exchange: all ranks reach the same decision."""
        strongest = max((n % WISHES for n in notes if n // WISHES == self.resumes), default=0)
        self.agreed_stop = self.agreed_stop or strongest == STOP
        self.agreed_state = "paused" if strongest == PAUSE else "training"

    def poll_paused(self) -> None:
        """Called repeatedly while paused: rank 0 publishes its wish, the others read it."""
        if self.rank == 0:
            if self.requested_stop:
                self.store.set(KEY, "stop")
                self.agreed_stop = True
            elif self.requested_state != "paused":
                self.resumes += 1
                self.store.set(KEY, f"resume {self.resumes}")
                self.agreed_state = "training"
            return
        message = self.store.get(KEY).decode() if self.store.check([KEY]) else ""
        if message == "stop" or self.requested_stop:
            self.agreed_stop = True
        elif message.startswith("resume ") and int(message.split()[1]) > self.resumes:
            self.resumes = int(message.split()[1])
            self.agreed_state = "training"
