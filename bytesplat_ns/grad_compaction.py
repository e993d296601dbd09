"""Sparse-gradient compaction: exchange only the gradient rows a rank's view touched.

Each rank's splat gradients are non-zero only for the splats its camera saw. Instead of a dense
all-reduce of [N, ...] tensors, every rank encodes its non-zero rows as (row indices, values), the
ranks all-gather those variable-length buffers, and each rank decodes them by scatter-adding into the
dense gradient, then divides by the world size: the same mean as an all-reduce.

Works with any torch.distributed backend (NCCL on GPUs, gloo on CPUs). Components, so far: the
trainer's multi-GPU path (a later piece of work) calls `average_sparse_rows` between backward and step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass
class PackedRows:
    """The non-zero rows of one gradient."""

    rows: Tensor  # [M] int64 row indices into the dense gradient
    values: Tensor  # [M, D] the rows, flattened to D values each (float32, or float16 when compressed)

    def nbytes(self) -> int:
        return self.rows.numel() * self.rows.element_size() + self.values.numel() * self.values.element_size()


def encode(grad: Tensor, half: bool = False) -> PackedRows:
    """grad: [N, ...] -> its rows with any non-zero entry (one host sync: the row count)."""
    flat = grad.reshape(grad.shape[0], -1)  # [N, D]
    rows = torch.nonzero(flat.ne(0).any(dim=1)).squeeze(1)  # [M]
    values = flat.index_select(0, rows)
    return PackedRows(rows=rows, values=values.half() if half else values)


def decode(packs: list[PackedRows], like: Tensor) -> Tensor:
    """Sum every rank's rows into a dense tensor shaped and typed like `like` ([N, ...])."""
    dense = torch.zeros(like.shape[0], like[0].numel(), dtype=like.dtype, device=like.device)  # [N, D]
    for pack in packs:
        dense.index_add_(0, pack.rows, pack.values.to(like.dtype))
    return dense.reshape(like.shape)


def all_gather_packed(pack: PackedRows, group=None) -> list[PackedRows]:
    """Every rank's PackedRows: counts first, then buffers padded to the largest count."""
    world = dist.get_world_size(group)
    count = torch.tensor([pack.rows.numel()], device=pack.rows.device)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count, group=group)
    counts = [int(c) for c in counts]  # host sync: buffer sizes
    width, most = pack.values.shape[1], max(counts)
    rows = torch.zeros(most, dtype=pack.rows.dtype, device=pack.rows.device)
    values = torch.zeros(most, width, dtype=pack.values.dtype, device=pack.values.device)
    rows[: counts[dist.get_rank(group)]] = pack.rows
    values[: counts[dist.get_rank(group)]] = pack.values
    all_rows = [torch.empty_like(rows) for _ in range(world)]
    all_values = [torch.empty_like(values) for _ in range(world)]
    dist.all_gather(all_rows, rows, group=group)
    dist.all_gather(all_values, values, group=group)
    return [PackedRows(r[:c], v[:c]) for r, v, c in zip(all_rows, all_values, counts)]


def average_sparse_rows(grad: Tensor, half: bool = False, group=None) -> int:
    """Replace `grad` ([N, ...]) in place by the mean over ranks of every rank's grad. Returns the bytes this
    rank sent (its packed rows, padding included), for comparison with a dense all-reduce's grad.nbytes."""
    pack = encode(grad, half=half)
    packs = all_gather_packed(pack, group=group)
    grad.copy_(decode(packs, grad) / dist.get_world_size(group))
    most = max(p.rows.numel() for p in packs)
    return most * (pack.rows.element_size() + pack.values.shape[1] * pack.values.element_size())
