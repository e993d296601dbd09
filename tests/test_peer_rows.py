"""Peers reading the rows (peer_rows.py): each rank unpacks the others' compacted rows straight from their memory.
Against a dense all-reduce, on ranks sharing one GPU (two or three processes, CUDA IPC on one device) and on two GPUs
(NCCL for the checks, NVLink for the rows), op by op and replayed from a CUDA graph; and a barrier whose peer never
arrives fails instead of hanging."""

from __future__ import annotations

import copy
import math
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bytesplat_ns.grad_compaction import SparseRowExchange, all_reduce_mean
from tests.test_grad_compaction import (
    REL_TOL_FP16,
    REL_TOL_FP32,
    ROWS,
    SH_DEGREE_1,
    SHAPES,
    STEPS,
    _ReplayedExchange,
    in_view,
    join_process_group,
    make_grad,
    relative,
    touched_rows,
    zero_past,
)

LAG = 2
GROWN = 2 * ROWS + 123
"""The splat count after a refine that outgrows every rank's region (made again, collectively)."""


def _grads(case: str, rank: int, step: int, rows: int, columns: list, device) -> list[torch.Tensor]:
    grads = [zero_past(make_grad(case, rank, step, shape), c) for shape, c in zip(SHAPES, columns)]
    if rows != ROWS:  # the grown scene: the same rows, then as many again and more
        grads = [torch.cat([g, g, g[: rows - 2 * ROWS]]) for g in grads]
    return [g.to(device) for g in grads]


def _worker(rank: int, world: int, init_file: str, backend: str, half: bool, graph: bool, columns) -> None:
    device = join_process_group(rank, world, init_file, backend)
    tolerance = REL_TOL_FP16 if half else REL_TOL_FP32
    per_part = columns or [None] * len(SHAPES)
    value_bytes = 2 if half else 4
    in_use = sum(math.prod(shape) if c is None else c for shape, c in zip(SHAPES, per_part))
    row_bytes = (4 // value_bytes + in_use) * value_bytes  # the index's slots and the values in use
    counts = []  # the rows this rank sent at each step
    replayed = {}
    exchange = SparseRowExchange(half=half, lag=LAG, kernels=True, peer_reads=True)
    try:
        steps = [(ROWS, case) for case in STEPS] + [(GROWN, case) for case in ("sparse", "dense", "sparse")]
        for step, (rows, case) in enumerate(steps):
            grads = _grads(case, rank, step, rows, per_part, device)
            visible = in_view(grads, rank, step)  # the pack kernel leaves the other rows unread
            seen = int(visible.ne(0).sum())  # where few rows are in view, every one of them is sent
            counts.append(seen if 2 * seen < rows else int(touched_rows(grads).sum()))
            want = [g.clone() for g in grads]
            all_reduce_mean(want)
            got = [g.clone() for g in grads]
            if graph:
                if rows not in replayed:
                    replayed[rows] = _ReplayedExchange(exchange, [torch.zeros_like(g) for g in grads], columns)
                stats = replayed[rows].average(got, note=10 * step + rank, visible=visible)
            else:
                stats = exchange.average(got, note=10 * step + rank, visible=visible, columns=columns)
            late = step - LAG
            assert stats.notes == ([10 * late + r for r in range(world)] if late >= 0 else [0] * world)
            assert not stats.dense and stats.overflows == 0, stats  # every row fits: nothing is ever held back
            assert exchange.capacity == rows
            assert relative(got, want) <= tolerance, (case, step)  # every step exact: nothing held back
            gathered = [torch.zeros_like(got[0]) for _ in range(world)]  # every rank holds the same bits
            dist.all_gather(gathered, got[0])
            assert all(torch.equal(g, gathered[0]) for g in gathered)
            if late >= 0:  # what the peers read: the rows this rank sent then and its header, not a capacity
                assert stats.sent_bytes == (world - 1) * (counts[late] + 1) * row_bytes, (step, stats)
        if graph:  # recorded once per splat count: the capacity never changes otherwise
            assert [r.recordings for r in replayed.values()] == [1, 1], [r.recordings for r in replayed.values()]
        exchange.close()
    finally:
        for r in replayed.values():
            if r.graph is not None:
                r.graph.reset()
        dist.destroy_process_group()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="peers reading the rows need a CUDA GPU")
@pytest.mark.parametrize("graph", [False, True], ids=["op-by-op", "graph"])
@pytest.mark.parametrize(
    "world, half, columns",
    [(2, False, None), (2, True, SH_DEGREE_1), (3, False, SH_DEGREE_1)],
    ids=["two-fp32", "two-fp16-sh1", "three-fp32-sh1"],
)
def test_peer_reads_equal_dense_allreduce_with_ranks_sharing_one_gpu(tmp_path, world, half, columns, graph):
    """Random sparse rows, a rank that saw no splat, fully dense gradients (which fit: the capacity is every row),
    steps where no rank saw a splat, then a grown splat count (the regions made again): every step equals the dense
    all-reduce, the same bits on every rank (two ranks keep their own rows in place, three unpack into zeros in rank
    order); what a rank sends is what it counted: every row in view where few are, else the touched rows."""
    args = (world, str(tmp_path / "init"), "gloo-cuda", half, graph, columns)
    mp.spawn(_worker, args=args, nprocs=world, join=True)


@pytest.mark.two_gpus
@pytest.mark.parametrize("graph", [False, True], ids=["op-by-op", "graph"])
def test_peer_reads_equal_dense_allreduce_on_two_gpus(tmp_path, graph):
    """The same on two GPUs: the rows read over NVLink (or PCIe) from the other GPU's memory."""
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), "nccl", True, graph, SH_DEGREE_1), nprocs=2, join=True)


def _failing_barrier(rank: int, world: int, init_file: str, out: str, case: str) -> None:
    """Rank 0 exchanges and writes how that ended to `out`. "absent": rank 1 never arrives at the barrier.
    "out of step": rank 1 has run five barriers more than rank 0 (its epochs raised), then arrives."""
    join_process_group(rank, world, init_file, "gloo-cuda")
    exchange = SparseRowExchange(kernels=True, peer_reads=True, lag=LAG)
    grads = [torch.zeros(ROWS, *shape, device="cuda") for shape in SHAPES]
    exchange.begin(grads, note=0)  # makes and maps the regions (collective)
    exchange._peers.timeout_s = 3.0 if case == "absent" or rank == 1 else 60.0  # out of step: fails at once
    if rank == 1:
        if case == "absent":
            time.sleep(15)
            return
        exchange._peers._counter.add_(5)
    start = time.monotonic()
    try:
        exchange.exchange_rows(grads)
        torch.cuda.synchronize()
        outcome = "returned"
    except Exception as error:  # noqa: BLE001 - the kernel trapped: the CUDA context is gone with it
        outcome = f"raised after {time.monotonic() - start:.1f} s: {error}"
    if rank == 0:
        with open(out, "w") as f:
            f.write(outcome)
    os._exit(0)  # the context is unusable: leave without tearing anything down


@pytest.mark.skipif(not torch.cuda.is_available(), reason="peers reading the rows need a CUDA GPU")
@pytest.mark.parametrize("case", ["absent", "out of step"])
def test_a_barrier_fails_when_its_peer_never_arrives_or_is_out_of_step(tmp_path, case):
    """A peer that never arrives fails the barrier after its timeout (3 s here), instead of a hang; a peer that ran
    its barriers more often than this rank fails it at once (60 s timeout here), instead of letting every later
    barrier pass unordered."""
    out = tmp_path / "outcome.txt"
    mp.spawn(_failing_barrier, args=(2, str(tmp_path / "init"), str(out), case), nprocs=2, join=True)
    outcome = out.read_text()
    assert outcome.startswith("raised after"), outcome
    assert float(outcome.split()[2]) < 12, outcome


@pytest.mark.parametrize(
    "option, value", [("exchange", "screen"), ("exchange_kernels", False), ("exchange_one_step_late", True)]
)
def test_peer_reads_refuse_what_they_cannot_carry(tmp_path, option, value):
    """Another exchange, torch operations instead of the kernels (or the CPU), or the late exchange: refused at
    start-up, naming what to change."""
    from bytesplat_ns.input_checks import BadInputError
    from tests.trainer_setup import make_trainer

    pipeline = make_trainer(tmp_path, steps=1).pipeline
    config = copy.deepcopy(pipeline.config)
    config.exchange_peer_reads = True
    setattr(config, option, value)
    kernels = config.exchange_kernels  # on a GPU machine; the CPU has no kernels
    with pytest.raises(BadInputError, match="--pipeline.exchange-peer-reads True .* Change those or drop the option"):
        pipeline._check_peer_reads(config, kernels, config.exchange_one_step_late)


def test_peer_reads_need_the_kernels():
    """Asked for on CPU tensors (the torch path), the exchange says so at once."""
    exchange = SparseRowExchange(peer_reads=True)
    with pytest.raises(ValueError, match="need its CUDA kernels"):
        exchange._reserve_peer_rows([torch.zeros(4, 3)], 4)
