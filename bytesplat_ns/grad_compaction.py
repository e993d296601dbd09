"""Sparse-gradient compaction: exchange only the gradient rows a rank's view touched, without a host sync.

Each rank's splat gradients are non-zero only for the splats its camera saw. Instead of a dense all-reduce
of the [N, ...] gradients, each step (`SparseRowExchange.average`):
1. encode: the rows of the [N, D] gradient (every splat parameter side by side) with a non-zero entry, the
   first `capacity` of them (torch.nonzero_static, in row order; or one CUDA kernel, `kernels`, in no
   particular order; neither makes the host wait) go into one buffer of
   capacity + 1 rows behind a header row (this rank's non-zero row count, its note, a third value); each row is
   its index (int32, bit-cast into the value type's slots) then its D values (fp32, or fp16 as an option);
2. one all_gather_into_tensor of those equal-sized buffers;
3. decode: every rank's rows are added, in rank order and scaled by 1/world, into a zeroed dense gradient:
   the mean an all-reduce gives, and bitwise the same on every rank (a rank's rows are distinct, so no two
   additions race), which keeps the ranks' splats identical;
   with the kernels, the pack zeroes the gradient rows it read (`clear`), so the gradients are zeros by then
   without a pass over all of them; with one or two ranks it writes the rows it sent back instead, scaled by
   1/world as the unpack scales them, and the unpack adds the other rank's rows alone (a + b and b + a are the
   same bits; with three, (a + b) + c and (c + a) + b need not be): a pass over one rank's rows saved;
   each rank packs into its own slice of the all-gather's output, which spares the all-gather a local copy;
4. the gathered headers go to host memory without waiting and are read `lag` exchanges later, when they
   have long arrived (late_read.py): the counts set the capacity, the notes carry pause/stop requests
   (run_control.py). Both act `lag` steps late, on every rank alike. Reading them late is what lets a rank's
   host run ahead of the others by up to `lag` steps instead of waiting each step for the slowest rank's
   previous exchange.

From `all_to_all_from` ranks on, the rows are routed to owners first: row i belongs to rank i mod W. Each rank
packs its touched rows into W buffers, one per owner (one kernel launch), one all_to_all_single delivers them, and
each owner adds what it received, in rank order, into the sums of its slice (fp32, [N / W, D]: row j stands for row
j W + rank); then steps 1-3 run on those sums: each owner all-gathers the rows of its slice that any rank touched,
named by their row in the whole, and every rank writes them, scaled by 1/world, into its gradients (each row comes
from one owner, so again the same bits everywhere). Two rounds instead of one, but a rank sends its touched rows
once (spread over the owners) and each owner its slice of their union once, where the all-gather sends every rank's
rows to each of the W - 1 others. The owners' header rows carry the largest count they received in the third
value, so the capacities of both rounds come from the gathered headers.

The capacities are the same on every rank (they come from the gathered counts and the capacities before them): the
largest count of the last `window` exchanges, as a fraction of the rows one buffer can hold at most (N; N / W
rounded up for an owner's), times `headroom`, plus one rung of room for the splats' growth, rounded up to a rung
(capacity_rungs.py: multiples of 1024 rows about 9% apart); kept while what the counts ask for falls within
`keep_above` of the capacity in use, except when the gradients change shape (densification moved the splats' rows to
another rung, the SH degree grew): the step graph records the exchange again when a capacity changes, and records it
then anyway, so the capacity moves with the rows and not at a step of its own (lego as rank 0 of two,
benchmarks/lone_rank.py: 56 recordings in 3500 steps against one GPU's 22, benchmarks/RESULTS.md, forty-seventh
session); every row until the first counts are read. A rank with more non-zero rows than a buffer's capacity (its
view saw far more than the recent ones) sends `capacity` of them and keeps the rest as a residual, added to its next
gradient: sent a step late, not lost, and the capacity grows once that exchange's counts are read
(`ExchangeStats.overflows`); an owner likewise holds back the sums that do not fit. A residual pending when
densification renumbers the splats is dropped (its row indices no longer mean anything): by `forget_held_rows`,
which the trainer calls before its callbacks edit the splats, and by `begin` when the splat count has changed. The
pack kernel reads and clears the residual only while it holds rows (a count on the device, `HeldRows`), so the usual
step, whose rows all fit, makes no pass over it.

One step late (`one_step_late`, late_update.py): the device part splits in two. `pack_for_later`, at the end of
a step, packs its rows into a buffer kept for the next step; `gather_packed`, at the start of the next, all-gathers
those buffers and writes their mean into gradients of its own (every row: zeros where no rank sent one), so the
next step's render runs beside it. The packed buffer's own rows are then marked sent (its count zeroed), so a
buffer is never gathered twice. The plan is always the all-gather of compacted rows (neither routed nor dense).

Peers reading the rows (`peer_reads`, peer_rows.py; the kernels, ranks on one machine): no all-gather. Each rank
packs into a region the other ranks have mapped, and each unpacks its peers' rows straight from their regions,
as many as their headers count; the capacity is every row, so nothing is held back, the capacity changes only
with the splat count, and the bytes that travel are the rows counted (`ExchangeStats.sent_bytes` counts them from
the headers read `lag` exchanges late). Where the render says which rows are in view and they are few, a rank
sends every row in view, zeros included (the pack then needs no test of each row's values nor a slot taken by
an atomic). Neither routed nor dense.

When the compacted buffers would carry more bytes than a dense ring all-reduce of the same gradients (so at
capacities near N, which is what the first `lag` exchanges use, or when many ranks' views overlap), the exchange is
that all-reduce instead, the headers riding in 3 W extra values, the residuals added and cleared. The decision
follows from the capacities, so every rank makes it alike; `ExchangeStats.dense` says when it was taken.

Which plan sends fewer bytes was measured on a 2M-splat scene's gradient rows for 2, 3, 4 and 8 ranks
(benchmarks/exchange_plans.py, benchmarks/RESULTS.md): with 2 ranks the all-gather sends 13-20% fewer bytes than
the routed plan (whose second round carries the union of both views); with 3 the two tie where views barely overlap
(a room seen from inside) and the routed plan sends 12% of the dense all-reduce's bytes fewer where they overlap (an
object seen from around it); from 4 ranks on the routed plan sends fewer in both (by 3-34% of the dense all-reduce's
bytes at 4 ranks, 20-128% at 8), and where views overlap the all-gather alone can exceed the dense all-reduce. The
routed plan also sums on the owners: on one GPU, with one rank, its exchange of one 2M-splat view took about 1.8x the
all-gather's time (there the slice is every row; benchmarks/exchange_cost.py). Hence routing from 4 ranks by default.

The caller may say which rows can be non-zero: `visible`, the render's screen radii ([N] int32), where a culled
splat's row (radius 0) holds zeros as long as the loss reaches the splats only through the render. The pack kernel
then skips those rows unread (a room seen from inside touches a fifth of them); the torch path, which reads every
row anyway, ignores it. It may also say which columns can be: `columns`, for each gradient the leading values of
its rows that can be non-zero (ByteSplatModel.gradient_columns: the SH coefficients up to the degree in use). The
others are neither sent nor written (they hold zeros on every rank), so a row carries D = the values in use: 14 of
a splat's 59 at SH degree 0, 23 at 1, 38 at 2. The bytes a dense all-reduce would send (`ExchangeStats.dense_bytes`)
still count every value.

Works with any torch.distributed backend (NCCL on GPUs, gloo on CPUs).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from bytesplat_ns.capacity_rungs import RUNG_RATIO, rung_above
from bytesplat_ns.cuda import ops
from bytesplat_ns.late_read import STEPS_LATE, LateQueue
from bytesplat_ns.peer_rows import FREE, READY, PeerRows
from bytesplat_ns.phase_clock import PhaseClock

CAPACITY_GRANULE = 1024
"""Capacities are rungs of this many rows and more (capacity_rungs.py)."""


@dataclass
class ExchangeStats:
    """What one exchange moved, in bytes each rank sent, against a dense ring all-reduce of the same gradients."""

    sent_bytes: int
    """Compacted: this rank's buffers to the world - 1 peers (capacity + 1 rows each; with owners, also its
    route_capacity + 1 rows to each other owner); peers reading the rows: the rows this rank's header counted
    (and the header) to each peer, from the headers of `lag` exchanges back (before those, every row)."""
    dense_bytes: int
    """Dense ring all-reduce of the same fp32 gradients, every value of them (`columns` or not): 2 (world - 1) /
    world of their size."""
    notes: list[int]
    """Every rank's `note` of the exchange `lag` exchanges before this one, in rank order (zeros before that)."""
    overflows: int = 0
    """1 if that exchange had a buffer with more non-zero rows than its capacity."""
    dense: bool = False
    """This exchange was a dense all-reduce: the compacted buffers would have been larger."""
    part_seconds: dict[str, float] = field(default_factory=dict)
    """Host wall time of each part of this exchange: late read (the headers of `lag` exchanges back, the
    capacity), route (with owners: pack, all-to-all, sum), pack, all-gather, unpack, header copy."""


HEADER_INTS = 3
"""A buffer's header row: the non-zero row count, the note, the largest count an owner received (or 0)."""


@dataclass
class HeldRows:
    """Gradient rows a pack could not send (past its capacity), added to the next pack's rows."""

    values: Tensor
    """[rows, D] the held rows' values, zeros elsewhere."""
    count: Tensor
    """[1] int32 on the values' device: how many rows are held. The pack kernel reads `values` only when it is
    not 0, so holding nothing (every step whose rows fit) costs no pass over them."""

    @staticmethod
    def none(rows: int, width: int, device: torch.device) -> HeldRows:
        return HeldRows(torch.zeros(rows, width, device=device), torch.zeros(1, dtype=torch.int32, device=device))

    def clear(self) -> None:
        self.values.zero_()
        self.count.zero_()


@dataclass
class _Packed:
    """One step late: what `pack_for_later` wrote, for the next `gather_packed`."""

    buffer: Tensor
    """[W, capacity + 1, slots + D] this rank's slice packed, the all-gather's output."""
    key: tuple
    """(capacity, D, value dtype)."""
    columns: list | None
    """The `columns` it was packed with."""
    tag: tuple
    """(rows a buffer could need, capacity, 0): the late headers' tag."""
    sent_bytes: int


@dataclass
class SparseRowExchange:
    """The compacted gradient exchange of one training run (it keeps the capacities and last headers)."""

    half: bool = False
    """Send the values as float16 (the sums are formed in float32)."""
    headroom: float = 1.25
    """Capacity = this times the largest count seen in the last `window` exchanges."""
    window: int = 100
    keep_above: float = 0.8
    """A capacity in use is kept while the one the counts ask for lies between this fraction of it and it: the few
    percent a view's count drifts, and the rung of room a new capacity has, do not change it (and make the step
    graph record again)."""
    lag: int = STEPS_LATE
    """Exchanges between sending the headers and reading them on the host."""
    kernels: bool = False
    """Pack and unpack CUDA gradients with bytesplat's kernels (cuda/csrc/sparse_rows.cu: one launch each) instead
    of torch operations (about twenty launches and several passes over [N, D])."""
    all_to_all_from: int = 4
    """Route the rows to owner ranks (all-to-all, then an all-gather of the owners' sums) from this many ranks on;
    with fewer, all-gather every rank's rows."""
    one_step_late: bool = False
    """Exchange each step's rows at the start of the next (`pack_for_later`, `gather_packed`; module docstring)."""
    peer_reads: bool = False
    """Each rank reads its peers' rows from their memory (peer_rows.py; module docstring) instead of an all-gather:
    the kernels, every rank on one machine."""
    group: object = None
    capacity: int = 0
    """Rows per rank in the last exchange's all-gather."""
    route_capacity: int = 0
    """Rows per owner in the last exchange's all-to-all (0: the rows were not routed)."""
    _fractions: deque = field(default_factory=deque)
    """The all-gather's largest count of recent exchanges, over the rows its buffer could need."""
    _route_fractions: deque = field(default_factory=deque)
    """The all-to-all's largest count of recent exchanges, over the rows an owner has."""
    _headers: LateQueue | None = None
    """Each exchange's gathered headers [W, 3], tagged with (rows a buffer could need, capacity, route capacity)."""
    _residual: HeldRows | None = None
    """[N, D] the rows this rank's earlier exchanges could not send; made when a capacity first falls below what
    its buffer could need, dropped when densification changes N."""
    _held: HeldRows | None = None
    """[ceil(N / W), D] with owners: the sums of this rank's slice its all-gather could not send (likewise); row j
    of a slice is row j W + rank of the whole."""
    _sums: Tensor | None = None
    """[ceil(N / W), D] with owners: this rank's sums of the rows routed to it, its slice."""
    _note: Tensor | None = None
    """[1] int32 on the gradients' device: this exchange's note, written into the header on the device."""
    _note_value: int = 0
    """What `_note` holds: it is written only when the note changes (a pause or stop), not with a launch each step."""
    _round: tuple = ([], 0)
    """(notes, overflows) read by the last `begin`."""
    _gathered_headers: Tensor | None = None
    """[W, 3] int32 every rank's header row of the last exchange (on the device)."""
    _shape: tuple = (0, 0)
    """(N, D) of the last exchange's gradients side by side, the values in use (`columns`)."""
    _columns: list | None = None
    """The last `begin`'s columns: for each gradient, the leading values of a row that can be non-zero (None: all)."""
    _all_values: int = 0
    """The values of a row of the last exchange's gradients, those not in use too (what a dense all-reduce sends)."""
    _sent_bytes: int = 0
    """Bytes this rank sends in the exchange `begin` prepared."""
    _routed: bool = False
    """Whether the exchange `begin` prepared routes the rows to owners."""
    _dense: bool = False
    """Whether the exchange `begin` prepared is a dense all-reduce."""
    _packed: _Packed | None = None
    """One step late: the buffer the last `pack_for_later` wrote, for the next `gather_packed`."""
    _buffers: dict = field(default_factory=dict)
    """One step late: (capacity, width, dtype) -> all-gather buffer [W, capacity + 1, slots + width], kept between
    steps (the step graph bakes their addresses in): the packed one and the one `begin` chose."""
    _gathered: _Packed | None = None
    """One step late: what the exchange `begin` prepared gathers (the last packed buffer; None: nothing yet)."""
    _peers: PeerRows | None = None
    """Peers reading the rows: every rank's region, mapped here."""
    _late_counts: list = field(default_factory=list)
    """Every rank's row count in the headers last read late (empty before the first)."""

    def __post_init__(self) -> None:
        self._headers = LateQueue(self.lag)

    def average(self, grads: list[Tensor], note: int = 0, dense: list[Tensor] = (),
                visible: Tensor | None = None, columns: list[int | None] | None = None) -> ExchangeStats:  # fmt: skip
        """Replace each of `grads` (all [N, ...], same N) in place by its mean over the ranks; `dense` gradients
        (camera optimizer, bilateral grid) take one plain all-reduce; `visible` [N] int32: rows where it is 0 hold
        zeros; `columns`: for each of `grads`, the leading values of a row that can be non-zero (None: all; module
        docstring). `begin`, `exchange_rows` and `end` in turn."""
        parts: dict[str, float] = {}
        laps = PhaseClock(parts)
        if dense:
            all_reduce_mean(list(dense), group=self.group)
            laps.lap("dense all-reduce")
        self.begin(grads, note, columns)
        laps.lap("late read")
        self.exchange_rows(grads, laps, visible)
        stats = self.end()
        laps.lap("header copy")
        stats.part_seconds = parts
        return stats

    def begin(self, like: list[Tensor], note: int, columns: list[int | None] | None = None) -> tuple:
        """The host's part before an exchange of gradients shaped and placed as `like` (the gradients, or their
        parameters), of which `columns` can be non-zero: read the headers of `lag` exchanges back, set the
        capacities, keep the residual buffers, put `note` in a device tensor, choose compacted rows or a dense
        all-reduce. -> what the device part bakes in (the step graph, step_graph.py, records `exchange_rows` again
        when it changes): the values per row, the capacities, the plan and the buffers' addresses."""
        world = dist.get_world_size(self.group)
        self._round = self._read_late_headers(world)
        self._columns = columns
        values = [math.prod(t.shape[1:]) for t in like]  # a row's, of each
        self._all_values = sum(values)
        in_use = values if columns is None else [v if c is None else min(v, c) for v, c in zip(values, columns)]
        num_rows, width = like[0].shape[0], sum(in_use)
        reshaped = (num_rows, width) != self._shape  # densification renumbered the splats, or the SH degree grew:
        if reshaped:
            self._residual = self._held = self._sums = None  # held rows mean nothing now
        self._shape = (num_rows, width)
        self._routed = world >= self.all_to_all_from and not self.one_step_late and not self.peer_reads  # 1: one
        # rank routes to itself (what the tests run on 1 GPU)
        limit = self._limit(world)
        self.capacity = (
            limit if self.peer_reads else self._next_capacity(self._fractions, limit, self.capacity, reshaped)
        )
        self.route_capacity = (
            self._next_capacity(self._route_fractions, limit, self.route_capacity, reshaped) if self._routed else 0
        )
        device = like[0].device
        if self._residual is None and (self.route_capacity if self._routed else self.capacity) < limit:
            self._residual = HeldRows.none(num_rows, width, device)
        if self._routed and self._held is None and self.capacity < limit:
            self._held = HeldRows.none(limit, width, device)
        if self._routed and self._sums is None:
            self._sums = torch.empty(limit, width, device=device)
        if self._note is None or self._note.device != device:
            self._note = torch.zeros(1, dtype=torch.int32, device=device)
            self._note_value = 0
        if note != self._note_value:
            self._note.fill_(note)
            self._note_value = note
        rows = self.capacity + 1 + (self.route_capacity + 1 if self._routed else 0)  # to each peer
        if self.peer_reads and self._late_counts:  # what the peers read: the rows counted
            rows = self._late_counts[dist.get_rank(self.group)] + 1
        self._sent_bytes = (world - 1) * rows * self._row_bytes()
        self._dense = (self._sent_bytes > ring_all_reduce_bytes(world, num_rows * width)
                       and not self.one_step_late and not self.peer_reads)  # fmt: skip
        if self._dense:
            self._sent_bytes = ring_all_reduce_bytes(world, num_rows * width + HEADER_INTS * world)
        held = [h.values if h is not None else None for h in (self._residual, self._held)]
        addresses = tuple(t.data_ptr() if t is not None else None for t in (*held, self._sums))
        if self.one_step_late:
            self._gathered = self._packed
            addresses += self._late_buffers(world, device)
        if self.peer_reads:
            addresses += (self._reserve_peer_rows(like, num_rows),)
        return self._shape, self.capacity, self.route_capacity, self._dense, addresses

    def _reserve_peer_rows(self, like: list[Tensor], num_rows: int) -> int:
        """Peers reading the rows: every rank's region with room for every row (of every value a row has, so that
        a higher SH degree still fits). -> this rank's region's address."""
        if not self._on_kernels(like):
            raise ValueError(
                "Peers reading the exchange's rows need its CUDA kernels on the GPU (SparseRowExchange(kernels=True) "
                "with CUDA gradients); use the all-gather (peer_reads=False) otherwise."
            )
        if self._peers is None:
            self._peers = PeerRows(self.group)
        row_bytes = (_slots(self._value_dtype()) + self._all_values) * self._value_dtype().itemsize
        return self._peers.reserve(num_rows, row_bytes, like[0].device)

    def forget_held_rows(self) -> None:
        """The splats are about to be renumbered (a refine, an opacity reset, the cap): rows held back for a later
        pack would reach the wrong splats after it, so they go (in place: a recorded step graph keeps the buffers).
        A renumbering that changes the splat count drops them in `begin` as well."""
        for held in (self._residual, self._held):
            if held is not None:
                held.clear()

    def close(self) -> None:
        """At the end of training: peers reading the rows free their regions once no rank uses them (collective)."""
        if self._peers is not None:
            self._peers.close()

    def _late_buffers(self, world: int, device: torch.device) -> tuple:
        """One step late: choose the buffer this step packs into (kept while its capacity and width are), drop
        those neither it nor the packed one uses. -> what the step graph bakes in from them."""
        key = self._buffer_key()
        if key not in self._buffers:  # zeros: a header count of 0, nothing to add until packed
            self._buffers[key] = torch.zeros(world, self.capacity + 1, self._row_width(), dtype=key[2], device=device)
        packed = self._packed
        keep = {key, packed.key} if packed is not None else {key}
        self._buffers = {k: v for k, v in self._buffers.items() if k in keep}
        gathered = (packed.buffer.data_ptr(), packed.key, tuple(packed.columns or ())) if packed is not None else None
        return self._buffers[key].data_ptr(), gathered

    def exchange_rows(self, grads: list[Tensor], laps: PhaseClock | None = None,
                      visible: Tensor | None = None) -> None:  # fmt: skip
        """The device's part, no host sync: (route this rank's rows to their owners and sum them there,) pack, all-
        gather every rank's rows, unpack their mean into `grads`; the gathered headers stay on the device for
        `end`. Uses what `begin` set (its `columns` too). `visible`: as in `average`."""
        laps = laps or PhaseClock({})
        world = dist.get_world_size(self.group)
        grads = leading_values(grads, self._columns)  # [N, D_p] each
        if self._dense:
            self._gathered_headers = self._all_reduce(grads, world)
            laps.lap("all-reduce")
            return
        rank = dist.get_rank(self.group)
        if self.peer_reads:
            self._read_peers(grads, world, rank, visible, laps)
            return
        # [W, capacity + 1, slots + D]: this rank packs into its own slice (an in-place all-gather: no local copy)
        dtype = self._value_dtype()
        gathered = grads[0].new_empty(world, self.capacity + 1, self._row_width(), dtype=dtype)
        mine = gathered[rank : rank + 1]
        own_rank = -1
        if self._routed:  # the sums of this rank's slice, row j for row j W + rank
            largest_received = self._route(grads, world, visible)  # leaves grads zero (kernels)
            laps.lap("route")
            self._pack([self._sums], self.capacity, self._held, index_scale=world, index_offset=rank, out=mine)
            _put_header_int(mine, 2, largest_received)
        else:  # with the kernels, grads hold zeros after it; with two ranks or one, this rank's share of the mean
            own_rank = rank if self._keeps_own_rows(grads, world) else -1
            own_scale = 1.0 / world if own_rank >= 0 else 0.0
            self._pack(grads, self.capacity, self._residual, visible=visible, clear=True, own_scale=own_scale, out=mine)
        laps.lap("pack")
        dist.all_gather_into_tensor(gathered, mine, group=self.group)
        laps.lap("all-gather")
        self._gathered_headers = self._unpack(grads, gathered, self.capacity, 1.0 / world, zeroed=True,
                                              own_rank=own_rank)  # fmt: skip
        laps.lap("unpack")

    def _read_peers(self, grads: list[Tensor], world: int, rank: int, visible: Tensor | None,
                    laps: PhaseClock) -> None:  # fmt: skip
        """Peers reading the rows: pack into this rank's region once every rank has read the rows there before,
        then, once every rank has packed, unpack the peers' rows from theirs (with one or two ranks each keeps its
        own rows in place, as the all-gather does)."""
        dtype, width = self._value_dtype(), self._row_width()
        buffers = [self._peers.rows(r, self.capacity, width, dtype) for r in range(world)]  # [capacity + 1, width]
        own_rank = rank if self._keeps_own_rows(grads, world) else -1
        own_scale = 1.0 / world if own_rank >= 0 else 0.0
        self._peers.barrier(FREE)
        self._pack(grads, self.capacity, None, visible=visible, clear=True, own_scale=own_scale,
                   out=buffers[rank].unsqueeze(0), send_in_view=True)  # fmt: skip
        self._peers.barrier(READY)
        laps.lap("pack")
        self._gathered_headers = self._unpack(grads, buffers, self.capacity, 1.0 / world, zeroed=True,
                                              own_rank=own_rank)  # fmt: skip
        laps.lap("unpack")

    def pack_for_later(self, grads: list[Tensor], visible: Tensor | None = None) -> None:
        """One step late, the first device part (at the end of a step): this rank's touched rows of `grads` (left as
        they are) into its slice of the buffer `begin` chose, with the capacity and `columns` it set; rows past the
        capacity wait in the residual, as in `exchange_rows`."""
        world, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        key = self._buffer_key()
        buffer = self._buffers[key]
        self._pack(leading_values(grads, self._columns), self.capacity, self._residual, visible=visible,
                   out=buffer[rank : rank + 1])  # fmt: skip
        tag = (self._limit(world), self.capacity, 0)
        self._packed = _Packed(buffer, key, self._columns, tag, self._sent_bytes)  # never dense: the compacted bytes

    def _buffer_key(self) -> tuple:
        """One step late: (capacity, D, value dtype) of the exchange `begin` prepared."""
        return self.capacity, self._shape[1], self._value_dtype()

    def gather_packed(self, into: list[Tensor]) -> None:
        """One step late, the second device part (at the start of the next step): all-gather every rank's packed
        buffer and write the mean of their rows into `into` (shaped as the gradients; every value of the packed
        `columns` written, zeros where no rank sent a row); this rank's buffer is marked sent. Nothing before a first
        pack (every rank alike). Uses what `begin` set."""
        packed = self._gathered
        if packed is None:
            return
        world, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        dist.all_gather_into_tensor(packed.buffer, packed.buffer[rank : rank + 1], group=self.group)
        into = leading_values(into, packed.columns)
        self._gathered_headers = self._unpack(into, packed.buffer, packed.key[0], 1.0 / world)
        self.mark_packed_sent()

    def mark_packed_sent(self) -> None:
        """Zero this rank's count in the packed buffer, so that a later `gather_packed` adds none of its rows (its
        note stays: the notes are levels, read late)."""
        if self._packed is not None:
            rank = dist.get_rank(self.group)
            zero = torch.zeros(1, dtype=torch.int32, device=self._packed.buffer.device)
            _put_header_int(self._packed.buffer[rank : rank + 1], 0, zero)

    def end(self) -> ExchangeStats:
        """The host's part after an exchange: start copying its gathered headers to the host (read `lag` exchanges
        later). -> what it moved, and the notes and overflows `begin` read."""
        world = dist.get_world_size(self.group)
        num_rows, width = self._shape
        limit = self._limit(world)
        sent = self._sent_bytes
        if self.one_step_late:  # the rows gather_packed gathered (packed a step before, with their capacity), if any
            gathered = self._gathered
            tag, sent = (gathered.tag, gathered.sent_bytes) if gathered is not None else (None, 0)
        elif self._dense:  # nothing held back
            tag = (limit, limit, limit if self._routed else 0)
        else:
            tag = (limit, self.capacity, self.route_capacity)
        if tag is not None:
            self._headers.push(self._gathered_headers, tag=tag)
        notes, overflows = self._round
        return ExchangeStats(
            sent_bytes=sent,
            dense_bytes=ring_all_reduce_bytes(world, num_rows * self._all_values),
            notes=notes,
            overflows=overflows,
            dense=self._dense,
        )

    def _limit(self, world: int) -> int:
        """The most rows one buffer can need: every row, or with owners an owner's slice."""
        return -(-self._shape[0] // world) if self._routed else self._shape[0]

    def _value_dtype(self) -> torch.dtype:
        return torch.float16 if self.half else torch.float32

    def _row_width(self) -> int:
        """Entries of one buffer row (its value type): the index's slots and the D values."""
        return _slots(self._value_dtype()) + self._shape[1]

    def _row_bytes(self) -> int:
        return self._row_width() * self._value_dtype().itemsize

    def _route(self, grads: list[Tensor], world: int, visible: Tensor | None) -> Tensor:
        """With owners: this rank's touched rows to their owners (rows that did not fit stay in the residual; grads
        zeroed, with the kernels), one all_to_all_single, the owner's sums of what it received into `_sums`. -> [1]
        int32 the largest count this owner received (every sender's count of its rows, sent or not)."""
        routed = self._pack(grads, self.route_capacity, self._residual, owners=world, visible=visible, clear=True)
        received = torch.empty_like(routed)
        dist.all_to_all_single(received, routed, group=self.group)
        headers = self._unpack([self._sums], received, self.route_capacity, 1.0, index_divisor=world)
        return headers[:, 0].max().view(1)

    def _all_reduce(self, grads: list[Tensor], world: int) -> Tensor:
        """grads = their mean over the ranks (with the residuals, then cleared), by one all-reduce that also
        carries every rank's header in 3 W extra values. -> the headers [W, 3] int32, with the counts the plan
        reads: the rank's non-zero row count; with owners, the largest count the rank had for one owner in the
        third value and each owner's non-zero row count of the mean in the first."""
        num_rows, width = self._shape
        flat = grads[0].new_empty(num_rows * width + HEADER_INTS * world)
        rows = flat[: num_rows * width].view(num_rows, width)
        torch.cat([g.reshape(num_rows, -1) for g in grads], dim=1, out=rows)
        rank = dist.get_rank(self.group)
        if self._residual is not None:
            rows.add_(self._residual.values)
            self._residual.clear()
        if self._held is not None:  # this rank's slice: rows rank, rank + W, ...
            slice_rows = rows[rank::world]
            slice_rows.add_(self._held.values[: len(slice_rows)])
            self._held.clear()
        headers = flat[num_rows * width :].view(world, HEADER_INTS)
        headers.zero_()
        mine = headers[rank]
        touched = rows.ne(0).any(dim=1)  # [N]; float32 holds the counts exactly up to 2^24 rows
        if self._routed:
            mine[2] = _owner_counts(touched, world).max()
        else:
            mine[0] = touched.sum()
        mine[1] = self._note[0]
        dist.all_reduce(flat, group=self.group)
        rows.div_(world)
        if self._routed:  # the same on every rank: the mean is
            headers[:, 0] = _owner_counts(rows.ne(0).any(dim=1), world)
        for grad, part in zip(grads, rows.split([math.prod(g.shape[1:]) for g in grads], dim=1)):
            grad.copy_(part.reshape(grad.shape))
        return headers.round().int()

    def _keeps_own_rows(self, grads: list[Tensor], world: int) -> bool:
        """Whether this rank's rows stay in its gradients as its share of the mean, the others' added to them (the
        kernels, one or two ranks): a + b on one rank and b + a on the other are the same bits, which a third rank's
        (a + b) + c against (c + a) + b would not be."""
        return self._on_kernels(grads) and world <= 2

    def _on_kernels(self, grads: list[Tensor]) -> bool:
        """Whether bytesplat's kernels pack and unpack `grads` (asked for, and on the GPU); else torch operations."""
        return self.kernels and grads[0].is_cuda

    def _pack(self, grads: list[Tensor], capacity: int, residual: HeldRows | None, owners: int = 1,
              index_scale: int = 1, index_offset: int = 0, visible: Tensor | None = None,
              clear: bool = False, own_scale: float = 0.0, out: Tensor | None = None,
              send_in_view: bool = False) -> Tensor:  # fmt: skip
        """-> buffers [owners, capacity + 1, slots + D] (`out`, if given) of the touched rows of `grads` (the rows
        `residual` holds added in; the rows that did not fit held there instead), row i in buffer i mod owners and
        named i * index_scale + index_offset, this exchange's note in each header. With the kernels, the rows where
        `visible` is 0 are not read, and `clear` leaves `grads` zero (for `_unpack(..., zeroed=True)`) but for the
        rows sent, with `own_scale`: own_scale x their sent values (for `_unpack(..., own_rank=rank)`);
        `send_in_view` (one owner, no residual): where few rows are in view, every one of them is sent, zeros
        included (ops.pack_rows)."""
        if self._on_kernels(grads):  # one launch; rows in no particular order
            values, count = (residual.values, residual.count) if residual is not None else (None, None)
            buffer = ops.pack_rows(grads, capacity, 0, self.half, values, count, owners, index_scale, index_offset,
                                   visible, clear, own_scale, out, send_in_view and visible is not None)  # fmt: skip
        else:
            buffer = self._pack_torch(grads, capacity, residual, owners, index_scale, index_offset, out)
        _put_header_int(buffer, 1, self._note)
        return buffer

    def _pack_torch(self, grads: list[Tensor], capacity: int, residual: HeldRows | None, owners: int,
                    index_scale: int, index_offset: int, out: Tensor | None) -> Tensor:  # fmt: skip
        """`_pack` from torch operations (any device): rows in row order; padding rows hold zeros (named as the
        last row: adding them changes nothing)."""
        num_rows = grads[0].shape[0]
        width = sum(g[0].numel() for g in grads)
        flat = grads[0].new_empty(num_rows + 1, width)  # [N + 1, D]; row N stays zero (padding reads it)
        torch.cat([g.reshape(num_rows, -1) for g in grads], dim=1, out=flat[:num_rows])
        flat[num_rows].zero_()
        if residual is not None:
            flat[:num_rows].add_(residual.values)
        dtype = self._value_dtype()
        slots = _slots(dtype)
        touched = flat[:num_rows].ne(0).any(dim=1)  # [N]
        owner = torch.arange(num_rows, device=flat.device) % owners if owners > 1 else None  # [N]
        buffer = out if out is not None else flat.new_empty(owners, capacity + 1, slots + width, dtype=dtype)
        buffer[:, 0].zero_()
        sent, counts = [], []
        for o in range(owners):
            mine = touched & (owner == o) if owner is not None else touched  # [N]
            rows = torch.nonzero_static(mine, size=capacity, fill_value=num_rows).squeeze(1)  # [capacity]
            counts.append(mine.sum(dtype=torch.int32).view(1))
            buffer[o, 0, :slots] = counts[-1].view(dtype)
            names = rows.clamp(max=max(num_rows - 1, 0)) * index_scale + index_offset  # [capacity]
            buffer[o, 1:, :slots] = names.int().view(dtype).view(capacity, slots)
            buffer[o, 1:, slots:] = flat.index_select(0, rows)
            sent.append(rows)
        if residual is not None:  # rows that did not fit wait here, added to the next gradient
            residual.values.copy_(flat.index_fill_(0, torch.cat(sent), 0)[:num_rows])
            residual.count.copy_(torch.cat(counts).sub(capacity).clamp(min=0).sum(dtype=torch.int32).view(1))
        return buffer

    def _unpack(self, grads: list[Tensor], gathered: Tensor | list[Tensor], capacity: int, scale: float,
                index_divisor: int = 1, zeroed: bool = False, own_rank: int = -1) -> Tensor:  # fmt: skip
        """grads = scale * the sum of the rows of `gathered` [W, capacity + 1, slots + D] (or W buffers of [capacity
        + 1, slots + D]: the peers' regions), row i added at i // index_divisor, in rank order into zeros (the same
        bits on every rank); `zeroed`: a `clear` pack left `grads` zero (with the kernels: not zeroed again);
        `own_rank` (kernels): they hold that rank's rows, scaled, already. -> the headers [W, 3] int32."""
        if self._on_kernels(grads):  # one call
            return ops.unpack_rows(grads, gathered, capacity, scale, index_divisor, zeroed, own_rank)
        num_rows, widths = grads[0].shape[0], [g[0].numel() for g in grads]
        slots = _slots(gathered[0].dtype)
        dense = grads[0].new_zeros(num_rows + 1, sum(widths))  # [N + 1, D]; rows past a buffer's count go to row N
        headers = torch.stack([buffer[0, : HEADER_INTS * slots] for buffer in gathered]).view(torch.int32)  # [W, 3]
        for buffer, count in zip(gathered, headers[:, 0]):
            rows = buffer[1:, :slots].clone().view(torch.int32).view(-1) // index_divisor  # [capacity]
            live = torch.arange(capacity, device=rows.device) < count  # [capacity]
            rows = rows.clamp(min=0, max=num_rows).masked_fill(~live, num_rows)
            dense.index_add_(0, rows, buffer[1:, slots:].to(dense.dtype), alpha=scale)
        for grad, part in zip(grads, dense[:num_rows].split(widths, dim=1)):
            grad.copy_(part.reshape(grad.shape))
        return headers

    def _read_late_headers(self, world: int) -> tuple[list[int], int]:
        """The notes of the exchange `lag` exchanges back, and whether it overflowed (0 or 1); its counts go into
        the capacity windows."""
        notes, overflows = [0] * world, 0
        for headers, (limit, capacity, route_capacity) in self._headers.pop_ready():
            counts, notes, received = (list(column) for column in zip(*headers))
            self._late_counts = counts
            overflows += int(max(counts) > capacity or max(received) > route_capacity)
            _remember(self._fractions, max(counts) / max(1, limit), self.window)
            if route_capacity:
                _remember(self._route_fractions, max(received) / max(1, limit), self.window)
        return notes, overflows

    def _next_capacity(self, fractions: deque, limit: int, current: int, reshaped: bool) -> int:
        """Rows for a buffer that could need `limit`, `current` in use: every row until counts are read. A new
        capacity has a rung of room above what the counts ask for (for their growth as the splats grow); while the
        gradients keep their shape (`reshaped` False) the capacity in use is kept within `keep_above`."""
        if not fractions:
            return limit
        rows = math.ceil(limit * min(1.0, max(fractions) * self.headroom))
        if not reshaped and self.keep_above * current <= rows <= current <= limit:
            return current
        return max(1, min(limit, rung_above(math.ceil(rows * RUNG_RATIO), CAPACITY_GRANULE)))


def leading_values(tensors: list[Tensor], columns: list[int | None] | None) -> list[Tensor]:
    """[N, c] views of each of `tensors` ([N, ...], contiguous): the first c values of its rows, c from `columns` in
    the same order (None, or columns None: all of them); a tensor with no value in use is left out."""
    views = [t.view(t.shape[0], math.prod(t.shape[1:])) for t in tensors]
    if columns is None:
        return views
    if len(columns) != len(tensors):
        raise ValueError(f"columns names {len(columns)} gradients, the exchange has {len(tensors)}.")
    return [v[:, :c] if c is not None else v for v, c in zip(views, columns) if c != 0 and v.shape[1] > 0]


def _slots(dtype: torch.dtype) -> int:
    """Value slots holding one int32."""
    return 4 // dtype.itemsize


def _put_header_int(buffer: Tensor, index: int, value: Tensor) -> None:
    """Header value `index` of each buffer in `buffer` [owners, capacity + 1, slots + D] = `value` ([1] int32 on its
    device), written into the value type's slots (a float16 buffer's may start on a 2-byte boundary, where an int32
    view could not)."""
    slots = _slots(buffer.dtype)
    buffer[:, 0, index * slots : (index + 1) * slots] = value.view(buffer.dtype)


def _remember(window: deque, value: float, size: int) -> None:
    window.append(value)
    if len(window) > size:
        window.popleft()


def _owner_counts(touched: Tensor, owners: int) -> Tensor:
    """[owners] float: how many of the rows flagged in `touched` [N] bool belong to each owner (row i: i mod owners)."""
    padded = torch.nn.functional.pad(touched.float(), (0, -len(touched) % owners))
    return padded.view(-1, owners).sum(dim=0)


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

    def average(self, grads: list[Tensor], note: int = 0, dense: list[Tensor] = (),
                visible: Tensor | None = None, columns: list[int | None] | None = None) -> ExchangeStats:  # fmt: skip
        """Replace each of `grads` and `dense` in place by its mean over the ranks, in one all-reduce (`visible`
        and `columns` are not needed: every value is sent)."""
        world, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        notes = [0] * world
        for means, _ in self._notes.pop_ready():  # the means: note / world each
            notes = [round(n * world) for n in means]
        slots = grads[0].new_zeros(world)
        slots[rank] = note
        flat = all_reduce_mean([*grads, *dense, slots], group=self.group)
        self._notes.push(flat[-world:])
        dense_bytes = ring_all_reduce_bytes(world, flat.numel() - world)
        return ExchangeStats(sent_bytes=dense_bytes, dense_bytes=dense_bytes, notes=notes)


def ring_all_reduce_bytes(world: int, values: int) -> int:
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
