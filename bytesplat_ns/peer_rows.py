"""The ranks of one machine read each other's packed gradient rows directly, the rows counted and no more (#4).

The compacted exchange's all-gather (grad_compaction.py) moves buffers of a fixed capacity, since the step graph
replays fixed sizes; the capacity follows the largest count of recent views, so where views see very different
shares of a scene every rank sends far more rows than it touched (the 2M-splat room: 44% of the splats' rows a
step against 18% in view, benchmarks/RESULTS.md, thirty-eighth session), and every capacity change records the
step graph again. Here each rank packs into a region of device memory that the other ranks of its machine have
mapped (CUDA IPC; between GPUs over NVLink, or two processes on one GPU), and each rank's unpack kernel reads
a peer's rows straight from that region: as many as the peer's header counts, with a capacity of every row, so
nothing is held back and the capacity changes only with the splat count. Two barriers on the GPU order it
(csrc/peer_memory.h), both replayable in a CUDA graph with no host in between: FREE before the pack (every rank
is done reading the rows of the exchange before) and READY after it (every rank's rows are written).

A region holds a flag block, then room for (rows + 1) rows of every value a splat has (the values in use change
with the SH degree; the room does not), rows with `headroom` to spare, so it is made again (collectively: every
rank holds the same splat count) only when densification outgrows it. Regions go away only after every rank's GPU
is done with them (`close`, and before a region is made again).
"""

from __future__ import annotations

import math
import socket
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from bytesplat_ns.capacity_rungs import rung_above
from bytesplat_ns.cuda import ops

FREE, READY = 0, 1
"""The barriers' channels: every rank done reading the last rows; every rank's new rows written."""
ROW_GRANULE = 1024
"""A region's room in rows is a rung of this many rows and more (capacity_rungs.py)."""


@dataclass
class PeerRows:
    """Every rank's region of one training run, as mapped in this process, and the barrier among them."""

    group: object = None
    headroom: float = 1.25
    """A region made for N rows has room for this many times N (rounded up to a rung)."""
    timeout_s: float = 1800.0
    """A barrier whose peer has not arrived after this long fails (that rank hangs), as NCCL's collectives time out
    after 30 minutes. Not shorter: while rank 0 evaluates or writes a checkpoint the others' barriers wait for it,
    and a failed barrier kernel loses the GPU's context; a rank that dies is told by the rank watchdog first."""
    _regions: list[Tensor] = field(default_factory=list)
    """[bytes] uint8 each: every rank's region as mapped here, in rank order (this rank's own at its rank)."""
    _counter: Tensor | None = None
    """[PEER_CHANNELS] int32: this rank's barrier epochs, zeroed with the regions."""

    def reserve(self, rows: int, row_bytes: int, device: torch.device) -> int:
        """Make sure every region has room for `rows` + 1 rows of `row_bytes` (collective when it had not: every
        rank calls it at the same steps with the same numbers). -> this rank's region's address (what a step graph
        bakes in)."""
        needed = ops.PEER_FLAG_BYTES + (rows + 1) * row_bytes
        if not self._regions or self._regions[0].numel() < needed:
            room = rung_above(math.ceil((rows + 1) * self.headroom), ROW_GRANULE)
            self._make(ops.PEER_FLAG_BYTES + room * row_bytes, device)
        return self._regions[self._rank()].data_ptr()

    def rows(self, rank: int, capacity: int, width: int, dtype: torch.dtype) -> Tensor:
        """[capacity + 1, width] of `dtype`: rank `rank`'s rows (a peer's, read from its region; this rank's own)."""
        start = ops.PEER_FLAG_BYTES
        return self._regions[rank][start : start + (capacity + 1) * width * dtype.itemsize].view(dtype).view(-1, width)

    def barrier(self, channel: int) -> None:
        """Every rank waits on the GPU until every other has reached this barrier too (nothing with one rank)."""
        if len(self._regions) > 1:
            ops.peer_barrier(self._regions, self._counter, channel, self._rank(), self.timeout_s)

    def close(self) -> None:
        """Unmap the peers' regions and free this rank's, once no rank's GPU uses any (collective)."""
        if not self._regions:
            return
        own = self._regions[self._rank()]
        torch.cuda.synchronize(own.device)
        dist.barrier(group=self.group)  # every rank's GPU is done with every region
        self._regions, self._counter = [], None  # the peers' mappings closed
        dist.barrier(group=self.group)
        del own  # then this rank's own region freed

    def _make(self, num_bytes: int, device: torch.device) -> None:
        world = dist.get_world_size(self.group)
        if world > ops.PEER_RANKS:
            raise ValueError(
                f"{world} ranks cannot read each other's rows directly (at most {ops.PEER_RANKS}); "
                "use --pipeline.exchange-peer-reads False."
            )
        self.close()
        own = ops.peer_region(num_bytes, device)
        counter = torch.zeros(ops.PEER_CHANNELS, dtype=torch.int32, device=device)
        torch.cuda.synchronize(device)  # flags and epochs zero before any peer can signal
        mine = (socket.gethostname(), ops.peer_handle(own) if world > 1 else None)
        everyone: list = [None] * world
        dist.all_gather_object(everyone, mine, group=self.group)
        hosts = sorted({host for host, _ in everyone})
        if len(hosts) > 1:
            raise ValueError(
                f"--pipeline.exchange-peer-reads True needs every rank on one machine; these ranks run on {hosts}. "
                "Use --pipeline.exchange-peer-reads False with several machines."
            )
        rank = self._rank()
        self._regions = [own if r == rank else ops.open_peer_region(handle, num_bytes, device)
                         for r, (_, handle) in enumerate(everyone)]  # fmt: skip
        self._counter = counter

    def _rank(self) -> int:
        return dist.get_rank(self.group)
