"""Sparse-gradient compaction over gloo (2 to 4 CPU processes) equals a dense all-reduce, its rows all-gathered or
routed to owners; camera shards."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bytesplat_ns.datamanager import camera_shard, epoch_order, matched_epoch_order
from bytesplat_ns.grad_compaction import (
    DenseExchange,
    HeldRows,
    SparseRowExchange,
    all_reduce_mean,
    ring_all_reduce_bytes,
)
from tests.trainer_setup import make_trainer

ROWS = 5000
SHAPES = [(3,), (15, 3), (1,), (4,)]  # means, features_rest, opacities, quats
WIDTH = sum(math.prod(shape) for shape in SHAPES)  # values per row, side by side
SH_DEGREE_1 = [None, 9, None, None]
"""The values in use of each of SHAPES' rows at SH degree 1 (ByteSplatModel.gradient_columns): the first 3 of the 15
SH coefficients; the others hold zeros."""
REL_TOL_FP32 = 1e-6
REL_TOL_FP16 = 2e-3
STEPS = ["sparse", "sparse", "one_rank_sees_nothing", "sparse", "sparse", "dense"] + ["sparse"] * 4 + ["none"] * 4
"""The exchange's capacity adapts to the first steps; the dense step overflows it (its rows that do not fit
are sent a step later) and makes it grow once its counts are read (`lag` steps later); steps where no rank saw a
splat send what is still held back."""


def make_grad(case: str, rank: int, step: int, shape: tuple[int, ...]) -> torch.Tensor:
    torch.manual_seed(1000 * rank + 10 * step + len(shape))
    if case == "dense":
        return torch.randn(ROWS, *shape)
    grad = torch.zeros(ROWS, *shape)
    if case == "none" or (case == "one_rank_sees_nothing" and rank == 1):
        return grad
    rows = torch.randperm(ROWS)[: ROWS // 6]
    grad[rows] = torch.randn(len(rows), *shape)
    return grad


def zero_past(grad: torch.Tensor, columns: int | None) -> torch.Tensor:
    """`grad` with the values of each row past the first `columns` set to zero (as the SH coefficients past the
    degree in use are)."""
    if columns is not None:
        grad.view(ROWS, -1)[:, columns:] = 0
    return grad


def touched_rows(grads: list[torch.Tensor]) -> torch.Tensor:
    """[N] bool: the rows of `grads` (all [N, ...]) with a non-zero value."""
    return torch.cat([g.reshape(len(g), -1) for g in grads], 1).ne(0).any(1)


def in_view(grads: list[torch.Tensor], rank: int, step: int) -> torch.Tensor:
    """[N] int32 screen radii as a render would give them: non-zero on every touched row and on some others."""
    touched = touched_rows(grads)
    others = torch.rand(len(touched), generator=torch.Generator().manual_seed(100 * rank + step)) < 0.1
    return (touched.cpu() | others).int().mul(3).to(grads[0].device)


def sent_note(step: int, rank: int) -> int:
    """The note `rank` sends at `step`: each on two steps, then back to the one before (the exchange writes its note
    to the device only when it changes)."""
    return 10 * (step // 2 % 2) + rank


def relative(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max(float((g - w).norm() / w.norm().clamp_min(1e-30)) for g, w in zip(got, want))


class _ReplayedExchange:
    """The exchange as the step graph runs it with several GPUs (step_graph.py): its host parts around a replayed
    CUDA graph of its device part (pack, NCCL all-gather, unpack), recorded again when what `begin` says the graph
    bakes in changes (the capacity, the residual buffer, compacted rows or the dense all-reduce). The graph reads and
    writes gradients of its own."""

    def __init__(self, exchange: SparseRowExchange, like: list[torch.Tensor], columns: list | None = None) -> None:
        self.exchange, self.columns = exchange, columns
        self.grads = [torch.zeros_like(g) for g in like]
        self.visible = torch.zeros(like[0].shape[0], dtype=torch.int32, device=like[0].device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.key: tuple | None = None
        self.recordings = 0

    def average(self, grads: list[torch.Tensor], note: int, visible: torch.Tensor):
        for mine, grad in zip(self.grads, grads):
            mine.copy_(grad)
        self.visible.copy_(visible)
        key = self.exchange.begin(self.grads, note, self.columns)
        if key != self.key:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.exchange.exchange_rows(self.grads, visible=self.visible)
            self.key, self.recordings = key, self.recordings + 1
        self.graph.replay()
        for grad, mine in zip(grads, self.grads):
            grad.copy_(mine)
        return self.exchange.end()


def join_process_group(rank: int, world: int, init_file: str, backend: str) -> torch.device:
    """Join the test's process group: gloo (CPU tensors), gloo-cuda (gloo, every rank's tensors on GPU 0) or nccl
    (GPU `rank`). -> the device of this rank's tensors."""
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    elif backend == "gloo-cuda":
        device = torch.device("cuda", 0)
    dist.init_process_group(backend[:4], init_method=f"file://{init_file}", rank=rank, world_size=world)
    return device


def _worker(rank: int, world: int, init_file: str, half: bool, lag: int, route_from: int, backend: str = "gloo",
            graph: bool = False, columns: list | None = None) -> None:  # fmt: skip
    """gloo: CPU tensors, the exchange from torch operations; nccl: one GPU per rank, the exchange kernels (with
    `graph`, their device part replayed from a CUDA graph); gloo-cuda: every rank on GPU 0 (gloo moves the buffers
    through the host), the exchange kernels. Rows routed to owners from `route_from` ranks on. `columns`: the values
    in use of each gradient's rows (the others zero, not sent)."""
    device = join_process_group(rank, world, init_file, backend)
    tolerance = REL_TOL_FP16 if half else REL_TOL_FP32
    routed = world >= route_from
    limit = -(-ROWS // world) if routed else ROWS  # the most rows one buffer can need
    replayed = None
    try:
        exchange = SparseRowExchange(half=half, lag=lag, kernels=device.type == "cuda", all_to_all_from=route_from)
        replayed = _ReplayedExchange(exchange, [torch.zeros(ROWS, *shape, device=device) for shape in SHAPES], columns)
        per_part = columns or [None] * len(SHAPES)
        width = sum(math.prod(shape) if c is None else c for shape, c in zip(SHAPES, per_part))
        plain_exchange = DenseExchange(lag=lag)
        sum_got = [torch.zeros(ROWS, *shape, device=device) for shape in SHAPES]
        sum_want = [torch.zeros(ROWS, *shape, device=device) for shape in SHAPES]
        dense_at = STEPS.index("dense")
        plans = set()  # whether each exchange went dense
        for step, case in enumerate(STEPS):
            grads = [zero_past(make_grad(case, rank, step, shape), c).to(device) for shape, c in zip(SHAPES, per_part)]
            want = [g.clone() for g in grads]
            all_reduce_mean(want)
            got = [g.clone() for g in grads]
            visible = in_view(grads, rank, step)  # the pack kernel leaves the other rows unread
            if graph:
                stats = replayed.average(got, note=sent_note(step, rank), visible=visible)
            else:
                stats = exchange.average(got, note=sent_note(step, rank), visible=visible, columns=columns)
            late = step - lag  # the exchange whose headers this one reads
            assert stats.notes == ([sent_note(late, r) for r in range(world)] if late >= 0 else [0] * world)
            if late <= dense_at:  # the dense step overflowed the capacity: reported when its headers are read
                assert stats.overflows == int(late == dense_at), (step, stats)
            # nothing pending, nothing held back: exact before the dense step and, all-gathered, once the capacity
            # has grown to every row and sent what the dense step (and those after it) held back; routed, the gather's
            # capacity grows only once held-back rows reach the owners' sums, so rows may stay pending longer (the
            # sums at the end show that none is lost)
            if step < dense_at or (not routed and step > dense_at + lag):
                assert relative(got, want) <= tolerance, (case, step)
            # compacted rows unless their buffers would be larger than a dense all-reduce, then that all-reduce
            value_bytes = 2 if half else 4
            assert (exchange.route_capacity > 0) == routed
            rows = exchange.capacity + 1 + (exchange.route_capacity + 1 if routed else 0)  # to each peer
            compacted = (world - 1) * rows * (4 // value_bytes + width) * value_bytes  # the values in use only
            assert stats.dense_bytes == ring_all_reduce_bytes(world, ROWS * WIDTH)  # every value
            assert stats.dense == (compacted > ring_all_reduce_bytes(world, ROWS * width)), (step, stats)
            assert stats.sent_bytes <= (stats.dense_bytes if not stats.dense else stats.dense_bytes + 24 * world)
            if lag <= step < dense_at and not half and world == 2:  # capacity from the sparse steps, far below 5000
                assert not stats.dense and stats.sent_bytes < stats.dense_bytes, stats
            plans.add(stats.dense)
            for total, g in zip(sum_got, got):
                total += g
            for total, w in zip(sum_want, want):
                total += w
            gathered = [torch.zeros_like(got[0]) for _ in range(world)]  # every rank holds the same result
            dist.all_gather(gathered, got[0])
            assert all(torch.equal(g, gathered[0]) for g in gathered)
            plain = [g.clone() for g in grads]
            assert plain_exchange.average(plain, note=rank).notes == [0 if late < 0 else r for r in range(world)]
            assert relative(plain, want) <= REL_TOL_FP32
        # the dense step overflowed the first round's capacity (routed: the gather's grows once the held-back rows
        # reach the owners' sums) and grew it
        assert "dense" in STEPS and (exchange.route_capacity if routed else exchange.capacity) == limit
        assert relative(sum_got, sum_want) <= tolerance  # what was held back went a step later, not lost
        if world > 1 and not half:  # both plans taken: dense at a capacity of every row (first steps, after the
            assert plans == {False, True}, plans  # overflow), compacted rows at the sparse steps' capacity
        if graph:  # recorded again as the capacity adapted (the first steps, the dense step's overflow)
            assert replayed.recordings >= 3, replayed.recordings
    finally:
        if replayed is not None and replayed.graph is not None:  # it holds NCCL's communicator (StepGraph.release)
            replayed.graph.reset()
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "world, lag, route_from",
    [(2, 1, 99), (3, 1, 99), (2, 4, 99), (2, 1, 2), (3, 4, 3), (4, 1, 4)],
    ids=lambda v: str(v) if v != 99 else "all-gather",
)
def test_compacted_exchange_equals_dense_allreduce(tmp_path, world, lag, route_from):
    """Random sparse rows, a rank that saw no splat, fully dense gradients (an overflow of the capacities); the
    headers read 1 or 4 steps late; every rank's rows all-gathered, or routed to owners (from `route_from` ranks)."""
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), False, lag, route_from), nprocs=world, join=True)


@pytest.mark.parametrize("route_from", [99, 2], ids=["all-gather", "routed"])
def test_half_precision_values(tmp_path, route_from):
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), True, 4, route_from), nprocs=2, join=True)


@pytest.mark.parametrize("world, route_from", [(2, 99), (3, 3)], ids=["all-gather", "routed"])
def test_only_the_values_in_use_travel(tmp_path, world, route_from):
    """At SH degree 1 a row's SH coefficients past the third hold zeros: the exchange sends the 17 values in use
    of the 59 and still gives the dense all-reduce's mean (the bytes a dense all-reduce would send count all 59)."""
    args = (world, str(tmp_path / "init"), False, 1, route_from, "gloo", False, SH_DEGREE_1)
    mp.spawn(_worker, args=args, nprocs=world, join=True)


@pytest.mark.parametrize("world", [1, pytest.param(2, marks=pytest.mark.two_gpus)])
@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("graph", [False, True], ids=["op-by-op", "graph"])
@pytest.mark.parametrize("route_from", [99, 1], ids=["all-gather", "routed"])
def test_exchange_kernels_over_nccl_equal_dense_allreduce(tmp_path, world, half, graph, route_from):
    """The same steps with the exchange kernels (pack, NCCL all-gather, unpack; routed: pack per owner, NCCL
    all-to-all, sum, then the same) on 1 or 2 GPUs, run op by op or replayed from a CUDA graph as the step graph
    does; replayed, with the values in use at SH degree 1 only."""
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA GPU(s) (NCCL and the exchange kernels)")
    args = (world, str(tmp_path / "init"), half, 4, route_from, "nccl", graph, SH_DEGREE_1 if graph else None)
    mp.spawn(_worker, args=args, nprocs=world, join=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the exchange kernels need a CUDA GPU")
@pytest.mark.parametrize("columns", [None, SH_DEGREE_1], ids=["all-values", "sh-degree-1"])
@pytest.mark.parametrize(
    "world, route_from, half",
    [(2, 2, False), (3, 3, False), (3, 3, True), (3, 99, False), (2, 99, False), (2, 99, True)],
)
def test_exchange_kernels_with_ranks_sharing_one_gpu(tmp_path, world, route_from, half, columns):
    """The exchange kernels with 2 and 3 ranks (over gloo, on one GPU): rows routed to owners, whose slices name
    row j as row j W + rank, or all-gathered (with two ranks each keeping its own rows in place); every value of a
    row, or those in use at SH degree 1; against the dense all-reduce, equal on every rank."""
    args = (world, str(tmp_path / "init"), half, 1, route_from, "gloo-cuda", False, columns)
    mp.spawn(_worker, args=args, nprocs=world, join=True)


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


@pytest.mark.parametrize("world, cameras", [(2, 24), (2, 25), (3, 100), (4, 7)])
def test_matched_draws_pair_views_of_similar_cost(world, cameras):
    """Every rank draws ceil(cameras / world) views an epoch, all of its shard (a shorter shard one twice), in a new
    order each epoch; ranked by cost, the views the ranks draw at one step are much closer in cost than with
    unmatched draws; with no costs known yet the epochs are still aligned."""
    costs = {c: float(v) for c, v in enumerate(torch.rand(cameras, generator=torch.Generator().manual_seed(3)))}
    shards = [camera_shard(cameras, world, rank, seed=42) for rank in range(world)]
    length = -(-cameras // world)
    gaps = {"matched": [], "unmatched": []}
    for epoch in range(4):
        matched = [matched_epoch_order(shard, costs, length, seed=42, epoch=epoch) for shard in shards]
        for shard, order in zip(shards, matched):
            assert len(order) == length and set(order) == set(shard)
        assert matched[0] != matched_epoch_order(shards[0], costs, length, seed=42, epoch=epoch + 1)
        unmatched = [epoch_order(shard, seed=42, epoch=epoch) for shard in shards]
        for name, orders in (("matched", matched), ("unmatched", unmatched)):
            for step in range(min(map(len, orders))):
                drawn = [costs[order[step]] for order in orders]
                gaps[name].append(max(drawn) - min(drawn))
        unknown = [matched_epoch_order(shard, {}, length, seed=42, epoch=epoch) for shard in shards]
        assert all(len(order) == length and set(order) == set(shard) for shard, order in zip(shards, unknown))
    if cameras >= 24:
        assert sum(gaps["matched"]) < 0.5 * sum(gaps["unmatched"]), gaps


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the exchange kernels need a CUDA GPU")
@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("capacity", [ROWS, 400, 150])  # all rows fit; fewer than the touched rows: a residual
@pytest.mark.parametrize("owners", [1, 3])
def test_pack_unpack_kernels_match_torch(half, capacity, owners):
    """Two ranks' gradients packed by the kernel (row i into buffer i mod owners), then unpacked in rank order,
    give the mean of the rows sent; the rows that did not fit are exactly the ones held in the residual, with their
    count; rows held from an earlier step are added in, a residual that holds none is not read, and the unpacking
    hands back every header."""
    from bytesplat_ns.cuda import ops

    device = torch.device("cuda")
    tolerance = REL_TOL_FP16 if half else REL_TOL_FP32
    slots = 2 if half else 1
    ranks = [[make_grad("sparse", rank, 0, shape).to(device) for shape in SHAPES] for rank in range(2)]
    earlier = torch.zeros(ROWS, sum(math.prod(s) for s in SHAPES), device=device)
    earlier[7] = 1.0  # a row held back from an earlier step, touched by no gradient now
    sent, buffers = [], []
    for rank, grads in enumerate(ranks):
        flat = torch.cat([g.reshape(ROWS, -1) for g in grads], 1) + (earlier if rank == 0 else 0)
        residual = count = None
        if rank == 0:  # holds a row: read, and every row written (the held row cleared once sent)
            residual, count = earlier.clone(), torch.ones(1, dtype=torch.int32, device=device)
        elif capacity < ROWS:  # holds none: not read (its NaNs must not reach the buffer), only rows kept written
            residual, count = torch.full_like(flat, float("nan")), torch.zeros(1, dtype=torch.int32, device=device)
        buffer = ops.pack_rows(grads, capacity, note=10 + rank, half=half, residual=residual, residual_rows=count,
                               owners=owners)  # fmt: skip
        assert buffer.shape == (owners, capacity + 1, slots + WIDTH)
        kept = torch.zeros_like(flat)
        touched = flat.ne(0).any(1)
        left = 0
        for owner in range(owners):
            touched_count, note, third = buffer[owner, 0, : 3 * slots].clone().view(torch.int32).tolist()
            assert (touched_count, note, third) == (int(touched[owner::owners].sum()), 10 + rank, 0)
            left += max(0, touched_count - capacity)
            rows = buffer[owner, 1 : 1 + min(touched_count, capacity), :slots].clone().view(torch.int32).view(-1).long()
            assert len(set(rows.tolist())) == len(rows) and bool((rows % owners == owner).all())  # each row once
            values = buffer[owner, 1 : 1 + len(rows), slots:].float()
            assert bool(torch.isfinite(values).all())
            assert float((values - flat[rows]).norm() / flat[rows].norm()) <= tolerance
            kept[rows] = flat[rows]
        if residual is not None:  # sent + held = everything, nothing twice
            assert int(count) == left
            held = touched & ~kept.ne(0).any(1)  # [N]
            assert int(held.sum()) == left
            if rank == 1:  # the rows not held were never written
                assert bool(residual[~held].isnan().all())
                residual[~held] = 0
            assert torch.isfinite(residual).all()
            assert not bool((kept.ne(0).any(1) & residual.ne(0).any(1)).any())
            assert float((kept + residual - flat).norm()) <= tolerance * float(flat.norm())
        else:
            assert float((kept - flat).norm()) <= tolerance * float(flat.norm())
        sent.append(kept)
        buffers.append(buffer)
    out = [torch.full_like(g, float("nan")) for g in ranks[0]]  # unpack_rows zeroes them first
    headers = ops.unpack_rows(out, torch.cat(buffers), capacity, 0.5)  # every buffer, as if from 2 x owners ranks
    assert [note for _, note, _ in headers.tolist()] == [10] * owners + [11] * owners
    want = (sent[0] + sent[1]) / 2
    got = torch.cat([g.reshape(ROWS, -1) for g in out], 1)
    assert float((got - want).norm() / want.norm()) <= tolerance


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the exchange kernels need a CUDA GPU")
@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("capacity", [ROWS, 400])  # all rows fit; fewer than the touched rows (the rest held back)
@pytest.mark.parametrize("told_view", [False, True])  # every row read; the rows in view (a quarter) listed, read alone
def test_two_ranks_keep_their_own_rows_and_get_the_same_bits(half, capacity, told_view):
    """A pack with `own_scale` leaves each rank's sent rows in its gradients as half their values as the other
    rank decodes them (float16 rounding included, -0.0 as +0.0), the rows held back and the rest as +0.0;
    unpacking the other rank's rows alone into them (`own_rank`) gives the same bits on both ranks (a -0.0 in a row
    only one rank sent included), and the values an unpack of both ranks into zeros gives."""
    from bytesplat_ns.cuda import ops

    device = torch.device("cuda")
    ranks = [[make_grad("sparse", rank, 0, shape).to(device) for shape in SHAPES] for rank in range(2)]
    touched = [torch.cat([g.reshape(ROWS, -1) for g in grads], 1).ne(0).any(1) for grads in ranks]  # [N] each
    only_rank_1 = int((touched[1] & ~touched[0]).nonzero()[0])
    ranks[1][2][only_rank_1] = -0.0  # an opacity gradient of -0.0 in a row rank 0 does not send
    ranks[0][0][ROWS - 1] = -0.0  # a row of signed zeros (in view below, unless touched): zeroed, not sent
    buffers = []
    for rank, grads in enumerate(ranks):
        flat = torch.cat([g.reshape(ROWS, -1) for g in grads], 1)  # [N, D]
        visible = in_view(grads, rank, 0) if told_view else None
        if visible is not None:
            visible[ROWS - 1] = 1
        residual = count = None
        if capacity < ROWS:
            residual, count = torch.zeros_like(flat), torch.zeros(1, dtype=torch.int32, device=device)
        buffer = ops.pack_rows(grads, capacity, rank, half, residual, count, visible=visible, clear=True,
                               own_scale=0.5)  # fmt: skip
        slots = 2 if half else 1
        sent = min(int(buffer[0, 0, :slots].clone().view(torch.int32)), capacity)
        names = buffer[0, 1 : 1 + sent, :slots].clone().view(torch.int32).view(-1).long()
        want = torch.zeros_like(flat)
        want[names] = buffer[0, 1 : 1 + sent, slots:].float() * 0.5 + 0.0  # -0.0 as +0.0
        after = torch.cat([g.reshape(ROWS, -1) for g in grads], 1)
        assert torch.equal(after.view(torch.int32), want.view(torch.int32))  # +0.0 where not sent, bit for bit
        if residual is not None:  # the rows not sent are held back, and zeros in the gradients
            assert int(count) == int(flat.ne(0).any(1).sum()) - capacity > 0
            assert not bool((residual.ne(0).any(1) & want.ne(0).any(1)).any())
        buffers.append(buffer)
    gathered = torch.cat(buffers)  # [2, capacity + 1, slots + D]
    into_zeros = [torch.full_like(g, float("nan")) for g in ranks[0]]
    ops.unpack_rows(into_zeros, gathered, capacity, 0.5)
    for rank, grads in enumerate(ranks):
        headers = ops.unpack_rows(grads, gathered, capacity, 0.5, own_rank=rank)
        assert [note for _, note, _ in headers.tolist()] == [0, 1]
        assert all(torch.equal(g, z) for g, z in zip(grads, into_zeros)), rank
    assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(*ranks))  # bit for bit


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the exchange kernels need a CUDA GPU")
@pytest.mark.parametrize("widths", [(0, 1, 300), (2,), (5, 7, 9, 11, 13, 15, 17, 19)])
def test_pack_kernel_rows_of_any_width(widths):
    """Parts of no value, of one, wider than a block's threads, and eight of them: the rows the pack kernel sends
    plus the ones it holds are the gradients, each row once, over many tiles of rows (the last one partial)."""
    from bytesplat_ns.cuda import ops

    device, rows, capacity = torch.device("cuda"), 3001, 700
    torch.manual_seed(len(widths))
    seen = torch.rand(rows, 1, device=device) < 0.4  # about 1,200 touched rows: more than fit
    grads = [torch.randn(rows, w, device=device) * seen for w in widths]
    flat = torch.cat(grads, 1)  # [N, D]
    residual, held = torch.zeros_like(flat), torch.zeros(1, dtype=torch.int32, device=device)
    buffer = ops.pack_rows(grads, capacity, note=3, half=False, residual=residual, residual_rows=held)
    touched = int(flat.ne(0).any(1).sum())
    assert buffer[0, 0, :3].clone().view(torch.int32).tolist() == [touched, 3, 0]
    assert int(held) == touched - capacity
    names = buffer[0, 1:, 0].clone().view(torch.int32).long()  # [capacity]
    assert len(set(names.tolist())) == capacity
    sent = torch.zeros_like(flat)
    sent[names] = buffer[0, 1:, 1:]
    assert torch.equal(sent + residual, flat)
    assert not bool((sent.ne(0).any(1) & residual.ne(0).any(1)).any())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the exchange kernels need a CUDA GPU")
@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("share", [None, 0.05, 0.9])  # every row read; rows in view listed and read alone; most
def test_kernels_read_and_write_only_the_values_in_use(half, share):
    """Gradients given as views of each row's leading values (the SH coefficients up to the degree in use): the
    pack sends exactly those values and clears them, the unpack writes them alone; the values past them (NaN
    here) are never read nor written."""
    from bytesplat_ns.cuda import ops
    from bytesplat_ns.grad_compaction import leading_values

    device, tolerance = torch.device("cuda"), REL_TOL_FP16 if half else REL_TOL_FP32
    slots = 2 if half else 1
    ranks, buffers, sent = [], [], []
    for rank in range(2):
        grads = [zero_past(make_grad("sparse", rank, 0, shape), c).to(device) for shape, c in zip(SHAPES, SH_DEGREE_1)]
        grads[1].view(ROWS, -1)[:, SH_DEGREE_1[1] :] = float("nan")  # past the values in use
        views = leading_values(grads, SH_DEGREE_1)  # [N, 3], [N, 9] of [N, 45], [N, 1], [N, 4]
        flat = torch.cat(views, 1)  # [N, 17]
        visible = None if share is None else in_view(views, rank, 0)
        if share is not None:  # the rows out of view are zeros; keep `share` of them listed
            keep = torch.rand(ROWS, generator=torch.Generator().manual_seed(rank)) < share
            visible = visible * (keep.to(device) | flat.ne(0).any(1)).int()
        buffer = ops.pack_rows(views, ROWS, note=rank, half=half, visible=visible, clear=True)
        assert buffer.shape == (1, ROWS + 1, slots + 17)
        count = int(buffer[0, 0, :slots].clone().view(torch.int32))
        names = buffer[0, 1 : 1 + count, :slots].clone().view(torch.int32).view(-1).long()
        got = torch.zeros_like(flat)
        got[names] = buffer[0, 1 : 1 + count, slots:].float()
        assert count == int(flat.ne(0).any(1).sum())
        assert float((got - flat).norm() / flat.norm()) <= tolerance
        assert all(bool(v.eq(0).all()) for v in views)  # cleared
        assert bool(grads[1].view(ROWS, -1)[:, SH_DEGREE_1[1] :].isnan().all())  # untouched
        ranks.append(grads)
        buffers.append(buffer)
        sent.append(flat)
    out = [torch.full_like(g, float("nan")) for g in ranks[0]]
    for zeroed in (False, True):  # zeroed: the caller's word that the values in use hold zeros already
        views = leading_values(out, SH_DEGREE_1)
        if zeroed:
            for v in views:
                v.zero_()
        ops.unpack_rows(views, torch.cat(buffers), ROWS, 0.5, zeroed=zeroed)
        want = (sent[0] + sent[1]) / 2
        assert float((torch.cat(views, 1) - want).norm() / want.norm()) <= tolerance
        assert bool(out[1].view(ROWS, -1)[:, SH_DEGREE_1[1] :].isnan().all())  # never written


def _rows_in_view(seed: int, share: float, unread: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """-> ([N] bool: about `share` of the rows in view, gradients [N, ...] of SHAPES on the GPU): 70% of the rows in
    view touched, half of the others -0.0, the rows out of view NaN where `unread` (the pack must never read them),
    else zeros (as the caller's word has it)."""
    device = torch.device("cuda")
    generator = torch.Generator(device=device).manual_seed(seed)
    view = torch.rand(ROWS, generator=generator, device=device) < share  # [N]
    touched = view & (torch.rand(ROWS, generator=generator, device=device) < 0.7)
    signed_zeros = view & ~touched & (torch.rand(ROWS, generator=generator, device=device) < 0.5)
    grads = []
    for shape in SHAPES:
        g = torch.randn(ROWS, *shape, generator=generator, device=device) * touched.view(-1, *[1] * len(shape))
        g[signed_zeros] = -0.0
        g[~view] = float("nan") if unread else 0.0
        grads.append(g)
    return view, grads


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the exchange kernels need a CUDA GPU")
@pytest.mark.parametrize("share", [0.05, 0.9])  # rows in view: listed and read alone, or every row read
@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("capacity", [ROWS, 60])  # all fit; fewer than the touched rows (the rest held back)
def test_pack_kernel_skips_rows_out_of_view_and_clears_what_it_read(share, held, capacity):
    """Told which rows are in view (screen radii), the pack kernel sends the rows the gradients hold (those past
    the capacity held back in the residual), reads no row out of view where few are in view (NaN there is never
    sent), and reads every row while the residual holds one (a held row out of view is sent). With `clear` every
    row it read is +0.0 afterwards, rows of -0.0 included; an unpack told that the gradients are zeros gives what
    an unpack zeroing them gives."""
    from bytesplat_ns.cuda import ops

    device = torch.device("cuda")
    unread = share < 0.5 and not held  # rows out of view are not read
    view, grads = _rows_in_view(int(share * 100) + held, share, unread)
    want = torch.cat([g.reshape(ROWS, -1) for g in grads], 1).nan_to_num(0.0)  # [N, D]
    residual = torch.zeros_like(want)
    count = torch.tensor([int(held)], dtype=torch.int32, device=device)
    out_of_view = int((~view).nonzero()[0])
    if held:  # a row held back from an earlier step, out of this view
        residual[out_of_view] = 1.0
        want[out_of_view] += 1.0
    radii = view.int() * 5
    buffer = ops.pack_rows(grads, capacity, 0, False, residual, count, visible=radii, clear=True)
    touched_rows = int(want.ne(0).any(1).sum())
    assert buffer[0, 0, :1].view(torch.int32).item() == touched_rows
    assert int(count) == max(0, touched_rows - capacity)
    after = torch.cat([g.reshape(ROWS, -1) for g in grads], 1)
    zeroed = view if unread else torch.ones_like(view)
    assert bool((after[zeroed].view(torch.int32) == 0).all())  # +0.0, bit for bit
    if unread:
        assert bool(after[~view].isnan().all())  # never read, never written
    got = [torch.full_like(g, float("nan")) for g in grads]
    ops.unpack_rows(got, buffer, capacity, 1.0)
    sent = torch.cat([g.reshape(ROWS, -1) for g in got], 1)
    assert not bool((sent.ne(0).any(1) & residual.ne(0).any(1)).any())  # sent or held, not both
    assert torch.equal(sent + residual, want)
    zeros = [torch.zeros_like(g) for g in grads]
    ops.unpack_rows(zeros, buffer, capacity, 1.0, zeroed=True)
    assert all(torch.equal(z, g) for z, g in zip(zeros, got))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the exchange kernels need a CUDA GPU")
@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("own_scale", [0.0, 0.5])  # cleared to zeros; this rank's share kept in place
@pytest.mark.parametrize("share", [0.2, 0.9])  # rows in view listed and sent whole; most: every row read as before
def test_pack_sends_every_row_in_view_in_order(half, own_scale, share):
    """`send_in_view`: where few rows are in view, every one of them is sent in row order, zeros and -0.0s
    included, the count being the rows in view; rows out of view (NaN here) are never read nor written; with
    `clear` the rows sent hold zeros, or own_scale x their values as the other ranks decode them (-0.0 as +0.0).
    Where most rows are in view the pack reads every row and sends the touched ones, as without it."""
    from bytesplat_ns.cuda import ops

    listed = share < 0.5
    view, grads = _rows_in_view(int(share * 10) + half, share, listed)
    flat = torch.cat([g.reshape(ROWS, -1) for g in grads], 1)  # [N, D]
    buffer = ops.pack_rows(grads, ROWS, 0, half, visible=view.int() * 4, clear=True, own_scale=own_scale,
                           send_in_view=True)  # fmt: skip
    slots = 2 if half else 1
    count = int(buffer[0, 0, :slots].clone().view(torch.int32))
    names = buffer[0, 1 : 1 + count, :slots].clone().view(torch.int32).view(-1).long()
    sent = buffer[0, 1 : 1 + count, slots:]  # [count, D]
    if listed:
        rows = view.nonzero().view(-1)
        assert count == len(rows) and torch.equal(names, rows)  # every row in view, in row order
    else:
        rows = flat.ne(0).any(1).nonzero().view(-1)
        assert count == len(rows) and torch.equal(names.sort().values, rows)
    bits = torch.int16 if half else torch.int32
    assert torch.equal(sent.view(bits), flat[names].to(sent.dtype).view(bits))  # -0.0 sent as it is
    after = torch.cat([g.reshape(ROWS, -1) for g in grads], 1)
    want = torch.zeros_like(flat)
    want[names] = sent.float() * own_scale + 0.0  # -0.0 as +0.0
    assert torch.equal(after.view(torch.int32)[view], want.view(torch.int32)[view])
    if listed:
        assert bool(after[~view].isnan().all())  # never read, never written
    with pytest.raises(RuntimeError, match="send_in_view"):
        ops.pack_rows(grads, ROWS, 0, half, clear=True, send_in_view=True)  # no rows in view given


@pytest.mark.parametrize("renderer", ["torch", "fused", "gsplat"])
def test_the_rows_the_exchange_skips_hold_zeros(tmp_path, renderer):
    """model.visible_radii, which the exchange takes as its word: after a training step's backward (at SH degree 3,
    on the fused loss path with the fused renderer, through autograd with the others), every gradient row of a
    splat the render culled (radius 0) is zero; with scale regularisation, a loss term off the render, it gives
    none."""
    trainer = _trained_one_step(tmp_path, renderer)
    model = trainer.pipeline.model
    model.step = 10 * model.config.sh_degree_interval * model.config.sh_degree  # every SH band
    for param in model.gauss_params.values():
        param.grad = None
    camera, batch = trainer.pipeline.datamanager.next_train(0)
    c2w = camera.camera_to_worlds.reshape(3, 4).to(model.means.device)
    with torch.no_grad():  # twenty splats behind the camera (it looks along -z)
        model.means[:20] = c2w[:, 3] + 0.5 * c2w[:, 2]
    _, loss_dict, _ = trainer.pipeline.train_loss_dict(camera, batch)
    sum(loss_dict.values()).backward()
    culled = model.visible_radii() == 0  # [N]
    assert bool(culled[:20].all()) and not bool(culled.all())
    for name, param in model.gauss_params.items():
        assert bool((param.grad[culled] == 0).all()), name
    assert bool(model.gauss_params["means"].grad[~culled].ne(0).any())
    model.config.use_scale_regularization = True
    assert model.visible_radii() is None


@pytest.mark.parametrize("renderer", ["torch", "fused", "gsplat"])
def test_the_columns_the_exchange_skips_hold_zeros(tmp_path, renderer):
    """model.gradient_columns, which the exchange takes as its word: after a training step's backward at SH degree
    0, 1 and 2, the SH coefficients past the degree have zero gradients, and those up to it do not."""
    trainer = _trained_one_step(tmp_path, renderer)
    model = trainer.pipeline.model
    for degree in range(model.config.sh_degree):
        model.step = degree * model.config.sh_degree_interval
        for param in model.gauss_params.values():
            param.grad = None
        _, loss_dict, _ = trainer.pipeline.train_loss_dict(*trainer.pipeline.datamanager.next_train(0))
        sum(loss_dict.values()).backward()
        columns = dict(zip(model.gauss_params, model.gradient_columns()))
        assert columns["features_rest"] == 3 * ((degree + 1) ** 2 - 1)
        assert [c for name, c in columns.items() if name != "features_rest"] == [None] * 5
        rest = model.features_rest.grad.flatten(1)  # [rows, 45]: with rows held (CUDA), more rows than splats
        assert bool(rest[:, columns["features_rest"] :].eq(0).all()), degree
        assert degree == 0 or bool(rest[:, : columns["features_rest"]].ne(0).any()), degree


def _trained_one_step(tmp_path, renderer: str):
    """A trainer of the small scene on `renderer` after one step (the training callbacks hand the model its
    optimizers)."""
    from tests.trainer_setup import cpu_config, small_scene

    if renderer != "torch" and not torch.cuda.is_available():
        pytest.skip(f"the {renderer} renderer needs a CUDA GPU")
    config = cpu_config(small_scene(tmp_path), tmp_path / "out", 1, renderer)
    config.machine.device_type = "cpu" if renderer == "torch" else "cuda"
    config.pipeline.model.renderer = renderer
    trainer = config.setup(local_rank=0, world_size=1)
    trainer.setup()
    trainer.train()
    return trainer


def test_missing_exchange_kernels_fail_at_start_naming_both_fixes(monkeypatch):
    from bytesplat_ns import pipeline
    from bytesplat_ns.cuda.build import FusedBuildError

    def no_build():
        raise FusedBuildError("nvcc was not found; install the CUDA toolkit")

    monkeypatch.setattr(pipeline.ops, "ext", no_build)
    with pytest.raises(FusedBuildError, match="(?s)nvcc was not found.*--pipeline.exchange-kernels False"):
        pipeline._build_exchange_kernels()


def test_rows_held_back_are_forgotten_in_place_before_the_splats_are_renumbered(tmp_path, monkeypatch):
    """Rows a pack held back (the residual, an owner's held rows) would reach the wrong splats after a refine, which
    renumbers them; with the splats' rows held at a capacity (splat_rows.py) the count, and so the buffers, can stay.
    The trainer has the exchange forget them, in place (a recorded step graph keeps the buffers), at every step
    whose callbacks edit the splats, and only there."""
    exchange = SparseRowExchange()
    exchange._residual, exchange._held = HeldRows.none(8, 3, "cpu"), HeldRows.none(4, 3, "cpu")
    for held in (exchange._residual, exchange._held):
        held.values[1:3] = 1.0
        held.count.fill_(2)
    buffers = [(h.values.data_ptr(), h.count.data_ptr()) for h in (exchange._residual, exchange._held)]
    exchange.forget_held_rows()
    for held, addresses in zip((exchange._residual, exchange._held), buffers):
        assert not held.values.any() and int(held.count) == 0
        assert (held.values.data_ptr(), held.count.data_ptr()) == addresses

    trainer = make_trainer(tmp_path, steps=30, warmup_length=5, refine_every=6)
    renumbered = []
    monkeypatch.setattr(trainer.pipeline, "splats_renumbered", lambda: renumbered.append(trainer.step))
    trainer.train()
    assert renumbered == [0, 12, 18, 24]  # the opacity reset at 0; refines from 12 (after a reset's pause)
