"""Sparse-gradient compaction: exchange only the gradient rows a rank's view touched, without a host sync.

Each rank's splat gradients are non-zero only for the splats its camera saw. Instead of a dense all-reduce
of the [N, ...] gradients, each step (`SparseRowExchange.average`):
1. encode: the rows of the [N, D] gradient (every splat parameter side by side) with a non-zero entry, the
   first `capacity` of them (torch.nonzero_static, in row order; or one CUDA kernel, `kernels`, in no
   particular order; neither makes the host wait) go into one buffer of
   capacity + 1 rows behind a header row (this rank's non-zero row count and its note); each row is its
   index (int32, bit-cast into the value type's slots) then its D values (fp32, or fp16 as an option);
2. one all_gather_into_tensor of those equal-sized buffers;
3. decode: every rank's rows are added, in rank order and scaled by 1/world, into a zeroed dense gradient:
   the mean an all-reduce gives, and bitwise the same on every rank (a rank's rows are distinct, so no two
   additions race), which keeps the ranks' splats identical;
4. the gathered headers go to host memory without waiting and are read `lag` exchanges later, when they
   have long arrived (late_read.py): the counts set the capacity, the notes carry pause/stop requests
   (run_control.py). Both act `lag` steps late, on every rank alike. Reading them late is what lets a rank's
   host run ahead of the others by up to `lag` steps instead of waiting each step for the slowest rank's
   previous exchange.

The capacity is the same on every rank (it comes from the gathered counts): the largest visible fraction of
the last `window` exchanges read times `headroom`, times N, rounded up to 1024 rows; all N rows until the
first counts are read. A rank with more non-zero rows than the capacity (its view saw far more than the
recent ones) sends `capacity` of them and keeps the rest as a residual, added to its next gradient: sent a
step late, not lost, and the capacity grows once that exchange's counts are read (`ExchangeStats.overflows`).
A residual pending when densification changes the splat count is dropped (its row indices no longer mean
anything).

When the compacted buffers would carry more bytes than a dense ring all-reduce of the same gradients (every rank
sends its buffer to the W - 1 others, the all-reduce 2 (W - 1) / W of the gradients: so at a capacity near N, which
is what the first `lag` exchanges use, or when many ranks' views overlap), the exchange is that all-reduce instead,
the headers riding in 2 W extra values, the residual added and cleared. The decision follows from the capacity, so
every rank makes it alike; `ExchangeStats.dense` says when it was taken.

Why an all-gather rather than an all-to-all: with an all-to-all each rank would own a slice of the splats,
receive the rows of its slice, sum them and send the sums back: two rounds, the second carrying the union
of the visible rows. On 2 GPUs that sends at least as many bytes as the all-gather (equal when both views
see the same splats), at twice the latency. Measured on a 2M-splat scene's gradient rows
(benchmarks/exchange_plans.py, benchmarks/RESULTS.md): with 2 ranks the all-gather sends 13-20% fewer bytes than
the all-to-all; from 4 ranks on the all-to-all sends fewer (by 3-34% of the dense all-reduce's bytes at 4 ranks,
20-128% at 8), and where views overlap the all-gather can exceed the dense all-reduce, which the fallback above then
takes. Only the all-gather is built: no machine here has more than 2 GPUs to run an all-to-all on.

Works with any torch.distributed backend (NCCL on GPUs, gloo on CPUs).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from bytesplat_ns.cuda import ops
from bytesplat_ns.late_read import STEPS_LATE, LateQueue
from bytesplat_ns.phase_clock import PhaseClock

CAPACITY_GRANULE = 1024
"""Capacities are multiples of this many rows (fewer distinct buffer sizes for the allocator)."""


@dataclass
class ExchangeStats:
    """What one exchange moved, in bytes each rank sent, against a dense ring all-reduce of the same gradients."""

    sent_bytes: int
    """Compacted: this rank's buffer (capacity + 1 rows) to each of the world - 1 peers."""
    dense_bytes: int
    """Dense ring all-reduce of the same fp32 gradients: 2 (world - 1) / world of their size."""
    notes: list[int]
    """Every rank's `note` of the exchange `lag` exchanges before this one, in rank order (zeros before that)."""
    overflows: int = 0
    """1 if that exchange had a rank with more non-zero rows than its capacity."""
    dense: bool = False
    """This exchange was a dense all-reduce: the compacted buffers would have been larger."""
    part_seconds: dict[str, float] = field(default_factory=dict)
    """Host wall time of each part of this exchange: late read (the headers of `lag` exchanges back, the
    capacity), pack, all-gather, unpack, header copy."""


@dataclass
class SparseRowExchange:
    """The compacted gradient exchange of one training run (it keeps the capacity and last headers)."""

    half: bool = False
    """Send the values as float16 (the sum is formed in float32)."""
    headroom: float = 1.25
    """Capacity = this times the largest visible fraction seen in the last `window` exchanges."""
    window: int = 100
    lag: int = STEPS_LATE
    """Exchanges between sending the headers and reading them on the host."""
    kernels: bool = False
    """Pack and unpack CUDA gradients with bytesplat's kernels (cuda/csrc/sparse_rows.cu: one launch each) instead
    of torch operations (about twenty launches and several passes over [N, D])."""
    group: object = None
    capacity: int = 0
    """Rows per rank in the last exchange."""
    _fractions: deque = field(default_factory=deque)
    _headers: LateQueue | None = None
    """Each exchange's gathered headers [W, 2], tagged with its capacity and row count."""
    _residual: Tensor | None = None
    """[N, D] the rows earlier exchanges could not send (zeros once sent); made when the capacity first falls below
    N, dropped when densification changes N."""
    _note: Tensor | None = None
    """[1] int32 on the gradients' device: this exchange's note, written into the header on the device."""
    _round: tuple = ([], 0)
    """(notes, overflows) read by the last `begin`."""
    _gathered_headers: Tensor | None = None
    """[W, 2] int32 every rank's header row of the last exchange (on the device)."""
    _residual_shape: tuple = (0, 0)
    """(N, D) of the last exchange's gradients side by side."""
    _sent_bytes: int = 0
    """Bytes this rank sent in the last exchange."""
    _dense: bool = False
    """Whether the exchange `begin` prepared is a dense all-reduce."""

    def __post_init__(self) -> None:
        self._headers = LateQueue(self.lag)

    def average(self, grads: list[Tensor], note: int = 0, dense: list[Tensor] = ()) -> ExchangeStats:
        """Replace each of `grads` (all [N, ...], same N) in place by its mean over the ranks; `dense` gradients
        (camera optimizer, bilateral grid) take one plain all-reduce. `begin`, `exchange_rows` and `end` in turn."""
        parts: dict[str, float] = {}
        laps = PhaseClock(parts)
        if dense:
            all_reduce_mean(list(dense), group=self.group)
            laps.lap("dense all-reduce")
        self.begin(grads, note)
        laps.lap("late read")
        self.exchange_rows(grads, laps)
        stats = self.end()
        laps.lap("header copy")
        stats.part_seconds = parts
        return stats

    def begin(self, like: list[Tensor], note: int) -> tuple:
        """The host's part before an exchange of gradients shaped and placed as `like` (the gradients, or their
        parameters): read the headers of `lag` exchanges back, set the capacity, keep the residual buffer, put
        `note` in a device tensor, choose compacted rows or a dense all-reduce. -> what the device part bakes in (the
        step graph, step_graph.py, records `exchange_rows` again when it changes): (capacity, residual buffer's
        address, dense)."""
        world = dist.get_world_size(self.group)
        self._round = self._read_late_headers(world)
        num_rows, width = like[0].shape[0], sum(math.prod(t.shape[1:]) for t in like)
        self._residual_shape = (num_rows, width)
        self.capacity = self._next_capacity(num_rows)
        if self._residual is not None and self._residual.shape != (num_rows, width):
            self._residual = None  # densification renumbered the splats: its rows no longer mean anything
        device = like[0].device
        if self._residual is None and self.capacity < num_rows:
            self._residual = torch.zeros(num_rows, width, device=device)
        if self._note is None or self._note.device != device:
            self._note = torch.zeros(1, dtype=torch.int32, device=device)
        self._note.fill_(note)
        dtype = torch.float16 if self.half else torch.float32  # of the values sent
        compacted = (world - 1) * (self.capacity + 1) * (self._slots(dtype) + width) * dtype.itemsize
        self._dense = compacted > _ring_all_reduce_bytes(world, num_rows * width)
        return self.capacity, self._residual.data_ptr() if self._residual is not None else None, self._dense

    def exchange_rows(self, grads: list[Tensor], laps: PhaseClock | None = None) -> None:
        """The device's part, no host sync: pack this rank's rows, all-gather every rank's, unpack their mean into
        `grads`; the gathered headers stay on the device for `end`. Uses what `begin` set."""
        laps = laps or PhaseClock({})
        world = dist.get_world_size(self.group)
        if self._dense:
            self._gathered_headers = self._all_reduce(grads, world)
            laps.lap("all-reduce")
            return
        kernels = self.kernels and grads[0].is_cuda
        buffer = (self._pack_kernel if kernels else self._pack_torch)(grads)
        laps.lap("pack")
        gathered = buffer.new_empty(world * buffer.shape[0], buffer.shape[1])
        dist.all_gather_into_tensor(gathered, buffer, group=self.group)
        gathered = gathered.view(world, *buffer.shape)  # [W, capacity + 1, slots + D]
        laps.lap("all-gather")
        if kernels:  # one call: zero, add every rank's rows in rank order, the headers [W, 2]
            self._gathered_headers = ops.unpack_rows(grads, gathered, self.capacity, 1.0 / world)
        else:
            self._gathered_headers = self._unpack_torch(grads, gathered, world)
        laps.lap("unpack")
        self._sent_bytes = (world - 1) * buffer.numel() * buffer.element_size()

    def end(self) -> ExchangeStats:
        """The host's part after an exchange: start copying its gathered headers to the host (read `lag` exchanges
        later). -> what it moved, and the notes and overflows `begin` read."""
        world = dist.get_world_size(self.group)
        num_rows, width = self._residual_shape
        sent_rows = num_rows if self._dense else self.capacity  # a dense exchange holds nothing back
        self._headers.push(self._gathered_headers, tag=(sent_rows, num_rows))
        notes, overflows = self._round
        return ExchangeStats(
            sent_bytes=self._sent_bytes,
            dense_bytes=_ring_all_reduce_bytes(world, num_rows * width),
            notes=notes,
            overflows=overflows,
            dense=self._dense,
        )

    @staticmethod
    def _slots(dtype: torch.dtype) -> int:
        """Value slots holding one int32."""
        return 4 // dtype.itemsize

    def _all_reduce(self, grads: list[Tensor], world: int) -> Tensor:
        """grads = their mean over the ranks (with the residual, then cleared), by one all-reduce that also carries
        every rank's header (its non-zero row count and note) in 2 W extra values. -> the headers [W, 2] int32."""
        num_rows, width = self._residual_shape
        flat = grads[0].new_empty(num_rows * width + 2 * world)
        rows = flat[: num_rows * width].view(num_rows, width)
        torch.cat([g.reshape(num_rows, -1) for g in grads], dim=1, out=rows)
        if self._residual is not None:
            rows.add_(self._residual)
            self._residual.zero_()
        headers = flat[num_rows * width :].view(world, 2)
        headers.zero_()
        mine = headers[dist.get_rank(self.group)]
        mine[0] = rows.ne(0).any(dim=1).sum()  # float32 holds counts exactly up to 2^24 rows
        mine[1] = self._note[0]
        dist.all_reduce(flat, group=self.group)
        rows.div_(world)
        for grad, part in zip(grads, rows.split([math.prod(g.shape[1:]) for g in grads], dim=1)):
            grad.copy_(part.reshape(grad.shape))
        self._sent_bytes = _ring_all_reduce_bytes(world, flat.numel())
        return headers.round().int()

    def _header_note(self, buffer: Tensor) -> Tensor:
        """The header row's note slot of `buffer` as an int32 [1]."""
        slots = self._slots(buffer.dtype)
        return buffer[0, slots : 2 * slots].view(torch.int32)

    def _pack_kernel(self, grads: list[Tensor]) -> Tensor:
        """One launch (cuda/csrc/sparse_rows.cu): the buffer, rows in no particular order; rows that did not fit
        stay in the residual (read and rewritten in place: one warp reads and writes each row)."""
        buffer = ops.pack_rows(grads, self.capacity, 0, self.half, self._residual, self._residual)
        self._header_note(buffer).copy_(self._note)
        return buffer

    def _pack_torch(self, grads: list[Tensor]) -> Tensor:
        """The same buffer from torch operations (any device): rows in row order, padding rows point at row N;
        rows that did not fit stay in the residual."""
        num_rows, capacity = grads[0].shape[0], self.capacity
        width = sum(g[0].numel() for g in grads)
        flat = grads[0].new_empty(num_rows + 1, width)  # [N + 1, D]; row N stays zero (padding reads it)
        torch.cat([g.reshape(num_rows, -1) for g in grads], dim=1, out=flat[:num_rows])
        flat[num_rows].zero_()
        if self._residual is not None:
            flat[:num_rows].add_(self._residual)
        dtype = torch.float16 if self.half else flat.dtype
        slots = self._slots(dtype)
        touched = flat[:num_rows].ne(0).any(dim=1)  # [N]
        rows = torch.nonzero_static(touched, size=capacity, fill_value=num_rows).squeeze(1)  # [capacity]
        buffer = flat.new_empty(capacity + 1, slots + flat.shape[1], dtype=dtype)
        buffer[0, :slots] = touched.sum(dtype=torch.int32).view(1).view(dtype)
        self._header_note(buffer).copy_(self._note)
        buffer[1:, :slots] = rows.int().view(dtype).view(capacity, slots)
        buffer[1:, slots:] = flat.index_select(0, rows)
        if self._residual is not None:  # rows that did not fit wait here, added to the next gradient
            self._residual.copy_(flat.index_fill_(0, rows, 0)[:num_rows])
        return buffer

    def _unpack_torch(self, grads: list[Tensor], gathered: Tensor, world: int) -> Tensor:
        """grads = the mean of every rank's rows, added in rank order into a zeroed dense [N + 1, D]. -> the ranks'
        headers [W, 2] int32."""
        num_rows, widths = grads[0].shape[0], [g[0].numel() for g in grads]
        slots = self._slots(gathered.dtype)
        dense = grads[0].new_zeros(num_rows + 1, sum(widths))  # [N + 1, D]
        for rank in range(world):
            rows = gathered[rank, 1:, :slots].contiguous().view(torch.int32).view(-1)  # [capacity]
            dense.index_add_(0, rows, gathered[rank, 1:, slots:].to(dense.dtype), alpha=1.0 / world)
        for grad, part in zip(grads, dense[:num_rows].split(widths, dim=1)):
            grad.copy_(part.reshape(grad.shape))
        return gathered[:, 0, : 2 * slots].contiguous().view(torch.int32)

    def _read_late_headers(self, world: int) -> tuple[list[int], int]:
        """The notes of the exchange `lag` exchanges back, and whether it overflowed (0 or 1); its counts go into
        the capacity window."""
        notes, overflows = [0] * world, 0
        for headers, (capacity, num_rows) in self._headers.pop_ready():
            counts, notes = zip(*headers)
            largest = max(counts)
            notes, overflows = list(notes), overflows + int(largest > capacity)
            self._fractions.append(largest / max(1, num_rows))
            if len(self._fractions) > self.window:
                self._fractions.popleft()
        return notes, overflows

    def _next_capacity(self, num_rows: int) -> int:
        if not self._fractions:
            return num_rows
        rows = math.ceil(num_rows * min(1.0, max(self._fractions) * self.headroom))
        return max(1, min(num_rows, -(-rows // CAPACITY_GRANULE) * CAPACITY_GRANULE))


@dataclass
class DenseExchange:
    """Every gradient in one all-reduce (--pipeline.exchange dense), the notes in W extra slots, read `lag` steps
    late like SparseRowExchange's."""

    group: object = None
    lag: int = STEPS_LATE
    """Exchanges between sending the notes and reading them on the host."""
    _notes: LateQueue | None = None

    def __post_init__(self) -> None:
        self._notes = LateQueue(self.lag)

    def average(self, grads: list[Tensor], note: int = 0, dense: list[Tensor] = ()) -> ExchangeStats:
        """Replace each of `grads` and `dense` in place by its mean over the ranks, in one all-reduce."""
        world, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        notes = [0] * world
        for means, _ in self._notes.pop_ready():  # the means: note / world each
            notes = [round(n * world) for n in means]
        slots = grads[0].new_zeros(world)
        slots[rank] = note
        flat = all_reduce_mean([*grads, *dense, slots], group=self.group)
        self._notes.push(flat[-world:])
        dense_bytes = _ring_all_reduce_bytes(world, flat.numel() - world)
        return ExchangeStats(sent_bytes=dense_bytes, dense_bytes=dense_bytes, notes=notes)


def _ring_all_reduce_bytes(world: int, values: int) -> int:
    """Bytes each rank sends in a ring all-reduce of `values` float32 values."""
    return 2 * (world - 1) * values * 4 // world


def all_reduce_mean(grads: list[Tensor], group=None) -> Tensor:
    """Replace each of `grads` in place by its mean over the ranks (one all-reduce of one flat buffer, returned)."""
    if not grads:
        return torch.empty(0)
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat.div_(dist.get_world_size(group))
    for grad, part in zip(grads, flat.split([g.numel() for g in grads])):
        grad.copy_(part.reshape(grad.shape))
    return flat
