"""Sparse-gradient compaction: exchange only the gradient rows a rank's view touched.

Each rank's splat gradients are non-zero only for the splats its camera saw. Instead of a dense
all-reduce of the [N, ...] gradients, every rank encodes its non-zero rows (over all splat parameters
at once) as (row indices, values), the ranks all-gather those variable-length buffers, and each rank
decodes them by adding every rank's rows, in rank order, into the dense gradient, then divides by the
world size: the mean an all-reduce would give, and bitwise the same on every rank (each rank's rows are
distinct, so no two additions race), which keeps the ranks' splats identical.

Why an all-gather rather than an all-to-all: with an all-to-all each rank would own a slice of the splats,
receive the rows of its slice, sum them and send the sums back: two rounds, the second carrying the union
of the visible rows. On 2 GPUs that sends at least as many bytes as the all-gather (equal when both views
see the same splats), at twice the latency; benchmarks/multi_gpu.py reports both byte counts from the rows
each step actually exchanged.

Works with any torch.distributed backend (NCCL on GPUs, gloo on CPUs). Two all-gathers (headers, then rows
and values in one buffer) and two host syncs: the row count (nonzero) and the gathered counts (buffer sizes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass
class PackedRows:
    """The non-zero rows of a gradient."""

    rows: Tensor  # [M] int32 row indices into the dense gradient
    values: Tensor  # [M, D] the rows, flattened to D values each (float32, or float16 when compressed)

    def row_bytes(self) -> int:
        return self.rows.element_size() + self.values.shape[1] * self.values.element_size()


@dataclass
class ExchangeStats:
    """What one exchange moved, in bytes each rank sent, against a dense ring all-reduce of the same gradients."""

    sent_bytes: int
    """Compacted: this rank's packed buffer (padded to the largest rank's) to each of the world - 1 peers."""
    dense_bytes: int
    """Dense ring all-reduce of the same fp32 gradients: 2 (world - 1) / world of their size."""
    notes: list[int]
    """Every rank's `note`, in rank order."""


def encode(flat: Tensor, half: bool = False) -> PackedRows:
    """flat: [N, D] -> its rows with any non-zero entry (one host sync: the row count)."""
    rows = torch.nonzero(flat.ne(0).any(dim=1)).squeeze(1)  # [M]
    values = flat.index_select(0, rows)
    return PackedRows(rows=rows.int(), values=values.half() if half else values)


def decode(packs: list[PackedRows], num_rows: int, dtype: torch.dtype) -> Tensor:
    """Sum every rank's rows, in rank order, into a dense [num_rows, D] tensor."""
    width = packs[0].values.shape[1]
    dense = torch.zeros(num_rows, width, dtype=dtype, device=packs[0].values.device)  # [N, D]
    for pack in packs:
        dense.index_add_(0, pack.rows, pack.values.to(dtype))
    return dense


def all_gather_packed(pack: PackedRows, note: int = 0, group=None) -> tuple[list[PackedRows], list[int]]:
    """Every rank's PackedRows and note. Two all-gathers: the (row count, note) headers, then one buffer per rank
    padded to the largest count, each row its index (int32, bit-cast into the value type's slots) then values."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    header = torch.tensor([pack.rows.numel(), note], device=pack.rows.device)
    headers = header.new_empty(world * 2)
    dist.all_gather_into_tensor(headers, header, group=group)
    counts, notes = headers.view(world, 2).T.tolist()  # host sync: buffer sizes
    most, count, width = max(counts), counts[rank], pack.values.shape[1]
    slots = 4 // pack.values.element_size()  # value slots holding one int32 row index
    buffer = pack.values.new_zeros(most, slots + width)
    buffer[:count, :slots] = pack.rows.view(pack.values.dtype).view(count, slots)
    buffer[:count, slots:] = pack.values
    gathered = buffer.new_empty(world * most, slots + width)
    dist.all_gather_into_tensor(gathered, buffer, group=group)
    gathered = gathered.view(world, most, slots + width)
    packs = [
        PackedRows(gathered[r, :c, :slots].contiguous().view(torch.int32).view(c), gathered[r, :c, slots:])
        for r, c in enumerate(counts)
    ]
    return packs, notes


def average_sparse_rows(grads: list[Tensor], half: bool = False, note: int = 0, group=None) -> ExchangeStats:
    """Replace each of `grads` (all [N, ...], same N) in place by its mean over the ranks.

    `note` is a small integer every rank sends along with its row count (the trainer uses it for pause/stop
    requests, so they cost no extra round trip); every rank's note comes back in the stats."""
    num_rows = grads[0].shape[0]
    widths = [g[0].numel() for g in grads]
    flat = torch.cat([g.reshape(num_rows, -1) for g in grads], dim=1)  # [N, D]
    pack = encode(flat, half=half)
    packs, notes = all_gather_packed(pack, note=note, group=group)
    world = dist.get_world_size(group)
    dense = decode(packs, num_rows, flat.dtype).div_(world)
    for grad, part in zip(grads, dense.split(widths, dim=1)):
        grad.copy_(part.reshape(grad.shape))
    most = max(p.rows.numel() for p in packs)
    return ExchangeStats(
        sent_bytes=(world - 1) * most * pack.row_bytes(),
        dense_bytes=2 * (world - 1) * flat.numel() * 4 // world,
        notes=notes,
    )


def average_dense(grads: list[Tensor], note: int | None = None, group=None) -> ExchangeStats:
    """Plain all-reduce mean of dense gradients, in one flat buffer (camera optimizer, bilateral grid; or every
    gradient with --pipeline.exchange dense). With `note`, every rank's note travels in W extra slots."""
    if not grads:
        return ExchangeStats(sent_bytes=0, dense_bytes=0, notes=[])
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    parts = [g.reshape(-1) for g in grads]
    if note is not None:
        slots = grads[0].new_zeros(world)
        slots[rank] = note
        parts.append(slots)
    flat = torch.cat(parts)
    dist.all_reduce(flat, group=group)
    values = flat[: flat.numel() - (world if note is not None else 0)].div_(world)
    for grad, part in zip(grads, values.split([g.numel() for g in grads])):
        grad.copy_(part.reshape(grad.shape))
    notes = [int(n) for n in flat[values.numel() :].tolist()] if note is not None else []  # host sync
    dense_bytes = 2 * (world - 1) * values.numel() * 4 // world
    return ExchangeStats(sent_bytes=dense_bytes, dense_bytes=dense_bytes, notes=notes)
