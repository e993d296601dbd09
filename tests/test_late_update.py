"""One step late (late_update.py): each step's exchange gathers the rows the step before packed, and their mean equals a
dense all-reduce of that step's gradients; over gloo on CPUs, ranks sharing one GPU (the exchange kernels), and
NCCL with the exchange replayed from a CUDA graph, its gather on a side stream."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bytesplat_ns.grad_compaction import SparseRowExchange, all_reduce_mean
from bytesplat_ns.late_update import LateUpdate
from tests.test_grad_compaction import (
    REL_TOL_FP16,
    REL_TOL_FP32,
    ROWS,
    SHAPES,
    STEPS,
    in_view,
    join_process_group,
    make_grad,
    relative,
)

LAG = 1


class _ReplayedLateStep:
    """A training step as the step graph records it one step late: gather the step before's rows (a side stream),
    write this step's gradients (the render's backward, here a copy of staged values), wait, pack them for the next
    step; recorded again when what the exchange or the late update bakes in changes."""

    def __init__(self, late: LateUpdate, grads: list[torch.Tensor], visible: torch.Tensor) -> None:
        self.late, self.grads, self.visible = late, grads, visible
        self.staged = [torch.zeros_like(g) for g in grads]
        self.graph: torch.cuda.CUDAGraph | None = None
        self.key: tuple | None = None
        self.recordings = 0

    def run(self, key: tuple) -> None:
        if key != self.key:
            if self.graph is not None:
                self.graph.reset()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.body()
            self.key, self.recordings = key, self.recordings + 1
        self.graph.replay()

    def body(self) -> None:
        self.late.gather()
        for grad, staged in zip(self.grads, self.staged):
            grad.copy_(staged)
        self.late.join()
        self.late.exchange.pack_for_later(self.grads, visible=self.visible)


def _worker(rank: int, world: int, init_file: str, backend: str, graph: bool, half: bool) -> None:
    """gloo: CPU tensors, the torch path; gloo-cuda: every rank on GPU 0, the exchange kernels; nccl: one GPU per
    rank, the exchange kernels, op by op or (`graph`) replayed."""
    device = join_process_group(rank, world, init_file, backend)
    tolerance = REL_TOL_FP16 if half else REL_TOL_FP32
    replayed = None
    try:
        exchange = SparseRowExchange(half=half, lag=LAG, kernels=device.type == "cuda", one_step_late=True)
        late = LateUpdate(exchange)
        params = [torch.zeros(ROWS, *shape, device=device) for shape in SHAPES]  # shapes alone matter
        grads = [torch.zeros_like(p) for p in params]  # what the step's backward writes
        visible = torch.zeros(ROWS, dtype=torch.int32, device=device)
        replayed = _ReplayedLateStep(late, grads, visible) if graph else None
        dense_at = STEPS.index("dense")
        sum_got = [torch.zeros_like(p) for p in params]
        sum_want = [torch.zeros_like(p) for p in params]
        wanted = None  # the dense all-reduce of the step before's gradients
        for step, case in enumerate(STEPS + ["sparse", "drain"]):  # the last step's rows, applied by a drain
            mine = [make_grad(case if case != "drain" else "none", rank, step, shape).to(device) for shape in SHAPES]
            want = [g.clone() for g in mine]
            all_reduce_mean(want)
            late.prepare(params)
            key = exchange.begin(params, note=10 * step + rank)
            if case == "drain":  # what the trainer's _apply_pending runs: the gather alone
                late.gather()
            elif graph:
                for staged, g in zip(replayed.staged, mine):
                    staged.copy_(g)
                visible.copy_(in_view(mine, rank, step))
                replayed.run((key, late.key()))
            else:
                late.gather()
                for grad, g in zip(grads, mine):
                    grad.copy_(g)
                late.join()
                exchange.pack_for_later(grads, visible=in_view(mine, rank, step))
            stats = exchange.end()
            got = late.averaged
            packed_at = step - 1 - LAG  # the step whose note this exchange's late read sees
            assert stats.notes == ([10 * packed_at + r for r in range(world)] if packed_at >= 0 else [0] * world)
            assert not stats.dense and (stats.sent_bytes > 0) == (step > 0 and world > 1)
            if step == 0:
                assert all(not g.any() for g in got)  # nothing packed yet
            elif step <= dense_at or case == "drain":  # the step before's mean, exactly (nothing held back until the
                assert relative(got, wanted) <= tolerance, (case, step)  # dense step, nor once it was all sent)
            gathered = [torch.zeros_like(got[1]) for _ in range(world)]  # every rank holds the same result
            dist.all_gather(gathered, got[1].contiguous())
            assert all(torch.equal(g, gathered[0]) for g in gathered)
            for total, g in zip(sum_got, got):
                total += g
            if case != "drain":
                for total, w in zip(sum_want, want):
                    total += w
            wanted = want
            late.pending = True
        assert relative(sum_got, sum_want) <= tolerance  # what was held back went a step later, not lost
        late.prepare(params)  # every row was gathered once: the next gather adds nothing
        exchange.begin(params, note=0)
        late.gather()
        exchange.end()
        assert all(not g.any() for g in late.averaged)
        if graph:
            assert replayed.recordings >= 2, replayed.recordings
    finally:
        if replayed is not None and replayed.graph is not None:  # it holds NCCL's communicator (StepGraph.release)
            replayed.graph.reset()
        dist.destroy_process_group()


@pytest.mark.parametrize("world, half", [(2, False), (3, False), (2, True)])
def test_each_exchange_gathers_the_step_befores_mean(tmp_path, world, half):
    """Random sparse rows, a rank that saw no splat, fully dense gradients (an overflow, sent a step later), over gloo
    on CPUs: each step's gathered mean is the dense all-reduce of the step before's gradients, the same on every
    rank; over all steps and a last gather, nothing lost; a buffer is never gathered twice."""
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), "gloo", False, half), nprocs=world, join=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the exchange kernels need a CUDA GPU")
@pytest.mark.parametrize("half", [False, True])
def test_exchange_kernels_one_step_late_with_ranks_sharing_one_gpu(tmp_path, half):
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), "gloo-cuda", False, half), nprocs=2, join=True)


@pytest.mark.parametrize("world", [1, pytest.param(2, marks=pytest.mark.two_gpus)])
@pytest.mark.parametrize("graph", [False, True], ids=["op-by-op", "graph"])
def test_one_step_late_over_nccl(tmp_path, world, graph):
    """NCCL, the exchange kernels; replayed, the gather recorded on a side stream beside the step's own work."""
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA GPU(s) (NCCL and the exchange kernels)")
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), "nccl", graph, False), nprocs=world, join=True)


def test_late_update_needs_a_late_exchange():
    with pytest.raises(ValueError, match="one_step_late=True"):
        LateUpdate(SparseRowExchange())


@pytest.mark.parametrize(
    "option, value, world, named",
    [("exchange", "screen", 2, "--pipeline.exchange compact"), ("exchange_all_to_all_from", 2, 2,
     "--pipeline.exchange-all-to-all-from above 2")],
)  # fmt: skip
def test_the_late_exchange_refuses_what_it_cannot_carry(tmp_path, option, value, world, named):
    """Another exchange, or rows routed to owners: refused at start-up, naming the fix."""
    from bytesplat_ns.input_checks import BadInputError
    from tests.trainer_setup import make_trainer

    pipeline = make_trainer(tmp_path, steps=1).pipeline
    config = copy.deepcopy(pipeline.config)
    config.exchange_one_step_late = True
    setattr(config, option, value)
    with pytest.raises(BadInputError, match=named):
        pipeline._check_one_step_late(config, world)
