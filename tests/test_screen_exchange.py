"""The screen exchange (screen_exchange.py) equals a dense all-reduce of each rank's parameter gradients: over gloo
with the torch renderer (CPU), over NCCL with the fused renderer (GPU), op by op and its device part replayed from a
CUDA graph; every rank ends with the same bits."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bytesplat_ns.grad_compaction import all_reduce_mean, ring_all_reduce_bytes
from bytesplat_ns.render import RasterCamera, RasterizeOptions, Splats, rasterize
from bytesplat_ns.render.fused_backend import fused_loss_step
from bytesplat_ns.render.screen_space import screen_space
from bytesplat_ns.render.types import ScreenSplats
from bytesplat_ns.screen_exchange import HEADER, ROW, RenderedView, ScreenExchange

SPLATS = 300
WIDTH, HEIGHT = 40, 32
REL_TOL = 1e-5
STEPS = ["seen", "one_rank_looks_away", "seen"]


def make_params(device: torch.device) -> list[torch.Tensor]:
    """Splat parameters as the model holds them (log scales, opacity logits, SH in two parts); the same on every
    rank."""
    g = torch.Generator().manual_seed(7)
    means = torch.randn(SPLATS, 3, generator=g) * 0.6
    quats = torch.randn(SPLATS, 4, generator=g)
    scales = (torch.rand(SPLATS, 3, generator=g) * 0.08 + 0.02).log()
    opacities = torch.randn(SPLATS, 1, generator=g)
    dc = torch.randn(SPLATS, 3, generator=g) * 0.5
    rest = torch.randn(SPLATS, 15, 3, generator=g) * 0.1
    return [p.to(device).requires_grad_() for p in (means, quats, scales, opacities, dc, rest)]


def activated(params: list[torch.Tensor]) -> Splats:
    means, quats, scales, opacities, dc, rest = params
    return Splats(means, quats, scales.exp(), opacities.sigmoid().squeeze(-1), dc, rest)


def camera(rank: int, step: int, device: torch.device, away: bool = False) -> RasterCamera:
    """A camera 3 units from the origin, its direction set by rank and step, looking at the splats (or away)."""
    angle = 0.9 * rank + 0.4 * step
    centre = torch.tensor([3 * math.cos(angle), 3 * math.sin(angle), 0.5 + 0.2 * step])
    forward = -centre if not away else centre
    z = forward / forward.norm()
    x = torch.linalg.cross(z, torch.tensor([0.0, 0.0, 1.0]))
    x = x / x.norm()
    rot = torch.stack([x, torch.linalg.cross(z, x), z])  # rows: camera axes in world space (OpenCV)
    viewmat = torch.eye(4)
    viewmat[:3, :3], viewmat[:3, 3] = rot, -rot @ centre
    K = torch.tensor([[40.0, 0.0, WIDTH / 2], [0.0, 40.0, HEIGHT / 2], [0.0, 0.0, 1.0]])
    return RasterCamera(viewmat.to(device), K.to(device), WIDTH, HEIGHT)


def view_loss(params: list[torch.Tensor], cam: RasterCamera, opts: RasterizeOptions, rank: int, step: int,
              fused_loss: bool = False):  # fmt: skip
    """-> (the loss of the render against a random target, the render's screen-space splats): L1 of `rasterize()`'s
    image, or with `fused_loss` splatfacto's loss formed by the fused kernels (fused_backend.fused_loss_step)."""
    target = torch.rand(HEIGHT, WIDTH, 3, generator=torch.Generator().manual_seed(100 * step + rank))
    target = target.to(cam.viewmat.device)
    if fused_loss:
        out = fused_loss_step(activated(params), cam, opts, target)
        return out.loss, out.screen
    out = rasterize(activated(params), cam, opts)
    return (out.rgb - target).abs().mean(), out.screen


def relative(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max(float((g - w).norm() / w.norm().clamp_min(1e-30)) for g, w in zip(got, want))


class _ReplayedUnpack:
    """The exchange's device part (pack, all-gather, backprop of every rank's view) replayed from a CUDA graph, as
    the step graph runs it: recorded once on static gradients and camera matrices, which each step copies in."""

    def __init__(self, exchange: ScreenExchange, params: list[torch.Tensor], opts: RasterizeOptions) -> None:
        device = params[0].device
        self.exchange, self.params = exchange, params
        zeros = [torch.zeros(1, SPLATS, 2), torch.zeros(1, SPLATS, 3), torch.zeros(SPLATS, 3), torch.zeros(SPLATS)]
        self.screen = ScreenSplats(*(t.to(device) for t in zeros), torch.zeros(SPLATS, device=device), None)
        for tensor in self.screen.differentiable():
            tensor.grad = torch.zeros_like(tensor)
        self.camera = RasterCamera(torch.eye(4, device=device), torch.eye(3, device=device), WIDTH, HEIGHT)
        self.view = RenderedView(self.screen, self.camera, lambda c: screen_space(activated(params), c, opts, "fused"),
                                 params)  # fmt: skip
        self.graph: torch.cuda.CUDAGraph | None = None

    def average(self, screen: ScreenSplats, cam: RasterCamera, note: int):
        """`screen`: without its autograd graph (ScreenSplats.detached): a graph still alive from an op-by-op render
        would hold the parameters' gradient accumulators, which belong to the default stream, and the recording's
        backward into them would make that stream wait on the recording (the step graph drops it likewise)."""
        for mine, theirs in zip(self.screen.differentiable(), screen.differentiable()):
            mine.grad.copy_(theirs.grad)
        self.camera.viewmat.copy_(cam.viewmat)
        self.camera.K.copy_(cam.K)
        self.exchange.begin(self.params, note)
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.exchange.exchange(self.view)
        self.graph.replay()
        return self.exchange.end()


def _worker(rank: int, world: int, init_file: str, backend: str, graph: bool = False, fused_loss: bool = False) -> None:
    """gloo: CPU tensors and the torch renderer; nccl: GPU `rank`, the fused renderer (with `graph`, the exchange's
    device part replayed from a CUDA graph; with `fused_loss`, the loss formed by the fused kernels)."""
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
    replayed = None
    try:
        renderer = "torch" if device.type == "cpu" else "fused"
        opts = RasterizeOptions(sh_degree=3, background=torch.full((3,), 0.3, device=device), backend=renderer)
        exchange = ScreenExchange(lag=1)
        replayed = _ReplayedUnpack(exchange, make_params(device), opts) if graph else None
        for step, case in enumerate(STEPS):
            cam = camera(rank, step, device, away=case == "one_rank_looks_away" and rank == 1)
            params = make_params(device)  # the dense all-reduce of each rank's own parameter gradients
            want = list(torch.autograd.grad(view_loss(params, cam, opts, rank, step, fused_loss)[0], params))
            all_reduce_mean(want)

            params = replayed.params if graph else make_params(device)
            loss, screen = view_loss(params, cam, opts, rank, step, fused_loss)
            loss.backward(inputs=screen.differentiable())  # as the trainer's step: backward stops in screen space
            if case == "one_rank_looks_away" and rank == 1:
                assert all(t.grad is None or not t.grad.any() for t in screen.differentiable())
            project = lambda c, params=params: screen_space(activated(params), c, opts, renderer)  # noqa: E731
            if graph:
                screen = screen.detached()
                del loss
                stats = replayed.average(screen, cam, note=10 * step + rank)
            else:
                stats = exchange.average(RenderedView(screen, cam, project, params), note=10 * step + rank)
            got = [p.grad for p in params]
            assert relative(got, want) <= REL_TOL, (case, step, relative(got, want))
            assert stats.notes == ([10 * (step - 1) + r for r in range(world)] if step else [0] * world)
            assert stats.sent_bytes == (world - 1) * (ROW * SPLATS + HEADER) * 4
            assert stats.dense_bytes == ring_all_reduce_bytes(world, 59 * SPLATS)
            flat = torch.cat([g.reshape(-1) for g in got])
            gathered = [torch.zeros_like(flat) for _ in range(world)]  # every rank holds the same bits
            dist.all_gather(gathered, flat)
            assert all(torch.equal(g, gathered[0]) for g in gathered)
    finally:
        if replayed is not None and replayed.graph is not None:  # it holds NCCL's communicator (StepGraph.release)
            replayed.graph.reset()
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_screen_exchange_equals_dense_allreduce_on_cpu(tmp_path, world):
    """Torch renderer over gloo; at one step rank 1 looks away from every splat."""
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), "gloo"), nprocs=world, join=True)


@pytest.mark.parametrize("world", [1, pytest.param(2, marks=pytest.mark.two_gpus)])
@pytest.mark.parametrize("graph", [False, True], ids=["op-by-op", "graph"])
@pytest.mark.parametrize("fused_loss", [False, True], ids=["render", "fused-loss"])
def test_screen_exchange_over_nccl_equals_dense_allreduce(tmp_path, world, graph, fused_loss):
    """Fused renderer (gsplat's projection, our SH kernels) over NCCL, on 1 or 2 GPUs, the exchange op by op or
    replayed from a CUDA graph as the step graph does; the loss an L1 of the image or the training's fused loss
    path (splatfacto's L1 and D-SSIM formed in the kernels)."""
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA GPU(s) (NCCL and the fused renderer)")
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), "nccl", graph, fused_loss), nprocs=world, join=True)
