"""Sparse-gradient compaction over gloo (2 and 3 CPU processes) equals a dense all-reduce; camera shards."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bytesplat_ns.datamanager import camera_shard, epoch_order
from bytesplat_ns.grad_compaction import average_dense, average_sparse_rows

ROWS = 600
SHAPES = [(3,), (15, 3), (1,), (4,)]  # means, features_rest, opacities, quats
REL_TOL_FP32 = 1e-6
REL_TOL_FP16 = 2e-3


def make_grad(case: str, rank: int, shape: tuple[int, ...]) -> torch.Tensor:
    torch.manual_seed(1000 * rank + len(shape))
    if case == "dense":
        return torch.randn(ROWS, *shape)
    grad = torch.zeros(ROWS, *shape)
    if case == "one_rank_sees_nothing" and rank == 1:
        return grad
    rows = torch.randperm(ROWS)[: ROWS // 6]
    grad[rows] = torch.randn(len(rows), *shape)
    return grad


CASES = ["sparse", "one_rank_sees_nothing", "dense"]


def _worker(rank: int, world: int, init_file: str, half: bool) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        for case in CASES[:1] if half else CASES:
            grads = [make_grad(case, rank, shape) for shape in SHAPES]
            dense = [g.clone() for g in grads]
            for g in dense:
                dist.all_reduce(g)
                g /= world
            compact = [g.clone() for g in grads]
            stats = average_sparse_rows(compact, half=half, note=rank)
            assert stats.notes == list(range(world))
            for got, want in zip(compact, dense):
                rel = float((got - want).norm() / want.norm().clamp_min(1e-30))
                assert rel <= (REL_TOL_FP16 if half else REL_TOL_FP32), (case, got.shape, rel)
            if case != "dense" and not half:
                assert stats.sent_bytes < stats.dense_bytes, stats
            plain = [g.clone() for g in grads]
            assert average_dense(plain, note=rank).notes == list(range(world))
            for got, want in zip(plain, dense):
                assert torch.allclose(got, want, rtol=REL_TOL_FP32, atol=1e-7)
            gathered = [torch.zeros_like(compact[0]) for _ in range(world)]  # every rank holds the same result
            dist.all_gather(gathered, compact[0])
            assert all(torch.equal(g, gathered[0]) for g in gathered)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_compacted_exchange_equals_dense_allreduce(tmp_path, world):
    """Random sparse rows, a rank that saw no splat, and fully dense gradients."""
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), False), nprocs=world, join=True)


def test_half_precision_values(tmp_path):
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), True), nprocs=2, join=True)


@pytest.mark.parametrize(
    "world, cameras", [(w, c) for w in (1, 2, 3, 4) for c in (1, 2, 3, 7, 100, 101) if c >= w]
)  # fewer cameras than ranks is refused by the datamanager
def test_camera_shards_are_disjoint_and_cover_everything(world, cameras):
    shards = [camera_shard(cameras, world, rank, seed=42) for rank in range(world)]
    flat = [i for shard in shards for i in shard]
    assert sorted(flat) == list(range(cameras))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    for epoch in range(3):
        assert sorted(epoch_order(shards[0], seed=42, epoch=epoch)) == shards[0]


def test_each_epoch_draws_a_new_order():
    shard = camera_shard(100, 2, 0, seed=42)
    assert epoch_order(shard, seed=42, epoch=0) != epoch_order(shard, seed=42, epoch=1)
    assert epoch_order(shard, seed=42, epoch=1) == epoch_order(shard, seed=42, epoch=1)
