"""The screen exchange (--pipeline.exchange screen): ranks send each view's gradients in screen space, 9 values a
splat, instead of the splat parameters' 59, and each rank carries every view's back to the parameters itself.

Every rank holds the same splats, and a view's gradients reach the parameters only through that view's projection
and SH colours, functions of the splats and the view's camera alone (render/screen_space.py). So a rank that has
another rank's camera and its gradients w.r.t. the projected splats (2D centre 2, conic 3, colour 3, opacity 1)
forms that view's parameter gradients as the rank that rendered it would. Each step (`ScreenExchange.average`):
1. the trainer's backward stops at the render's screen-space splats (`loss.backward(inputs=...)`): [N, 9];
2. one all_gather_into_tensor of those rows behind a header (the camera's world-to-camera matrix and intrinsics,
   this exchange's note, the image size) per rank; no host sync;
3. every rank, in rank order, computes each rank's view of the splats again and backpropagates that rank's rows,
   scaled by 1/world, into the parameters' gradients: the mean a dense all-reduce gives (to float rounding), and
   bitwise the same on every rank (the same operations on the same values in the same order), which keeps the
   ranks' splats identical;
4. the gathered headers go to host memory without waiting and are read `lag` exchanges later (late_read.py): the
   notes carry pause/stop requests (run_control.py), and the image sizes are checked.

Bytes: each rank sends (W - 1)(9 N + 32) float32 values, against 2 (W - 1) / W x 59 N for a dense ring all-reduce
of the parameters' gradients: 85% fewer with 2 GPUs, 69% with 4, none from about 13 (the all-gather grows with W).
No capacity to adapt and nothing held back: every row is sent, whatever each view saw. Compute: each rank runs every
rank's projection and SH, forward and backward, over all N splats (W of them, where the parameter-row exchange runs
its own view's backward once). Measured on one H200 (benchmarks/screen_exchange_cost.py, benchmarks/RESULTS.md): for
50,000 splats at 800x800 (lego's size) a rank's share of a two-GPU exchange costs about as much device time as the
compacted rows' and sends 1.8 MB instead of 12; for 2M splats at 1920x1080 the two views' projection and SH take
about 2.8 ms against the compacted rows' 0.16-1.1 ms, so there the compacted rows are the better trade.

Needs (`ineligible` says what is missing): the torch or fused renderer, training cameras of one size (a rank uses
its own image size for the others' views), and the loss reaching the splats only through the render: no scale
regularisation, camera optimizer, bilateral grid or depth in training.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from bytesplat_ns.grad_compaction import ExchangeStats, all_reduce_mean, ring_all_reduce_bytes
from bytesplat_ns.late_read import STEPS_LATE, LateQueue
from bytesplat_ns.phase_clock import PhaseClock
from bytesplat_ns.render.types import RasterCamera, ScreenSplats

ROW = 9
"""Values of one splat's screen-space gradient: 2D centre 2, conic 3, colour 3, opacity 1."""
HEADER = 32
"""A rank's header: world-to-camera matrix (16), intrinsics (9), note, width, height, padding."""
_NOTE, _SIZE = 25, 26


@dataclass
class RenderedView:
    """One rank's training view, its backward stopped at the screen-space splats."""

    screen: ScreenSplats
    """The render's screen-space splats, their gradients in .grad."""
    camera: RasterCamera
    """The view's camera (device matrices)."""
    project: Callable[[RasterCamera], ScreenSplats]
    """The splats seen from a camera, computed as the render computed them (model.screen_space)."""
    params: list[Tensor]
    """The splat parameters, whose .grad the exchange sets."""


@dataclass
class ScreenExchange:
    """The screen exchange of one training run (it keeps the late headers)."""

    group: object = None
    lag: int = STEPS_LATE
    """Exchanges between sending the headers and reading them on the host."""
    _headers: LateQueue | None = None
    _note: Tensor | None = None
    """[1] float32 on the device: this exchange's note, written into the header on the device."""
    _notes: list[int] | None = None
    """Every rank's note of the exchange `lag` exchanges back, read by `begin`."""
    _gathered_headers: Tensor | None = None
    """[W, HEADER] every rank's header of the last exchange (on the device)."""
    _rows: int = 0
    """N of the exchange `begin` prepared."""
    _parameter_values: int = 0
    """Values of the splat parameters' gradients (59 N at SH degree 3), for the dense all-reduce's bytes."""

    def __post_init__(self) -> None:
        self._headers = LateQueue(self.lag)

    def average(self, view: RenderedView, note: int = 0, dense: list[Tensor] = ()) -> ExchangeStats:
        """Set the splat parameters' gradients to the mean over the ranks of their views' gradients; `dense`
        gradients (camera optimizer, bilateral grid) take one plain all-reduce. `begin`, `exchange` and `end`."""
        parts: dict[str, float] = {}
        laps = PhaseClock(parts)
        if dense:
            all_reduce_mean(list(dense), group=self.group)
            laps.lap("dense all-reduce")
        self.begin(view.params, note)
        laps.lap("late read")
        self.exchange(view, laps)
        stats = self.end()
        laps.lap("header copy")
        stats.part_seconds = parts
        return stats

    def begin(self, params: list[Tensor], note: int) -> tuple:
        """The host's part before an exchange of the gradients of `params` (the splat parameters, [N, ...] each):
        read the headers of `lag` exchanges back, put `note` in a device tensor. -> what the device part bakes in
        (the step graph, step_graph.py, records `exchange` again when it changes)."""
        world = dist.get_world_size(self.group)
        self._notes = [0] * world
        for headers, _ in self._headers.pop_ready():
            self._notes = [round(h[_NOTE]) for h in headers]
            sizes = {(round(h[_SIZE]), round(h[_SIZE + 1])) for h in headers}
            if len(sizes) > 1:
                raise ValueError(
                    f"The screen exchange needs every rank's view at one image size; the ranks rendered {sizes}. "
                    "Train with --pipeline.exchange compact, or with cameras of one size."
                )
        self._rows = params[0].shape[0]
        self._parameter_values = sum(p.numel() for p in params)
        device = params[0].device
        if self._note is None or self._note.device != device:
            self._note = torch.zeros(1, device=device)
        self._note.fill_(note)
        return self._rows, world

    def exchange(self, view: RenderedView, laps: PhaseClock | None = None) -> None:
        """The device's part, no host sync: pack this rank's rows and header, all-gather every rank's, and
        backpropagate each rank's view into the parameters' gradients. Uses what `begin` set."""
        laps = laps or PhaseClock({})
        world = dist.get_world_size(self.group)
        send = self.pack(view.screen, view.camera)
        laps.lap("pack")
        gathered = send.new_empty(world, send.shape[1])  # [W, 9 N + HEADER]
        dist.all_gather_into_tensor(gathered, send, group=self.group)
        laps.lap("all-gather")
        self.unpack(gathered, view)
        self._gathered_headers = gathered[:, ROW * self._rows :]
        laps.lap("unpack")

    def pack(self, screen: ScreenSplats, camera: RasterCamera) -> Tensor:
        """-> [1, 9 N + HEADER] float32: the screen-space gradients (zeros where a tensor has none), then the
        header."""
        n = self._rows
        send = screen.means2d.new_empty(1, ROW * n + HEADER)
        grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in screen.differentiable()]
        torch.cat([g.reshape(n, -1) for g in grads], dim=1, out=send[0, : ROW * n].view(n, ROW))
        header = send[0, ROW * n :]
        header.zero_()
        header[:16].copy_(camera.viewmat.reshape(-1))
        header[16:25].copy_(camera.K.reshape(-1))
        header[_NOTE : _NOTE + 1].copy_(self._note)
        header[_SIZE].fill_(camera.width)
        header[_SIZE + 1].fill_(camera.height)
        return send

    def unpack(self, gathered: Tensor, view: RenderedView) -> None:
        """The parameters' gradients = the mean over the ranks of their views' gradients: each rank's rows of
        `gathered` [W, 9 N + HEADER] backpropagated through its camera's projection, in rank order."""
        n, world = self._rows, gathered.shape[0]
        width, height = view.camera.width, view.camera.height  # every rank's (checked late, in `begin`)
        for param in view.params:
            param.grad = None  # the first rank's view sets them, the others add, in rank order
        for rank in range(world):
            header = gathered[rank, ROW * n :]
            camera = RasterCamera(header[:16].view(4, 4), header[16:25].view(3, 3), width, height)
            rows = gathered[rank, : ROW * n].view(n, ROW) * (1.0 / world)  # [N, 9]
            with torch.enable_grad():
                seen = view.project(camera).differentiable()
            parts = rows.split([t.numel() // n for t in seen], dim=1)
            torch.autograd.backward(seen, [part.reshape(t.shape).contiguous() for part, t in zip(parts, seen)],
                                    inputs=view.params)  # fmt: skip

    def end(self) -> ExchangeStats:
        """The host's part after an exchange: start copying its gathered headers to the host (read `lag` exchanges
        later). -> what it moved, and the notes `begin` read."""
        world = dist.get_world_size(self.group)
        self._headers.push(self._gathered_headers)
        return ExchangeStats(
            sent_bytes=(world - 1) * (ROW * self._rows + HEADER) * 4,
            dense_bytes=ring_all_reduce_bytes(world, self._parameter_values),
            notes=self._notes,
        )


def ineligible(model, cameras) -> str | None:
    """Why the screen exchange cannot train `model` on the training `cameras` (None: it can)."""
    cfg = model.config
    sizes = {(int(w), int(h)) for w, h in zip(cameras.width.reshape(-1), cameras.height.reshape(-1))}
    checks = [
        (model.renderer() not in ("torch", "fused"), f"the {model.renderer()} renderer (use fused or torch)"),
        (len(sizes) > 1, f"training cameras of {len(sizes)} sizes"),
        (cfg.use_scale_regularization, "scale regularisation (a loss term outside the render)"),
        (cfg.camera_optimizer.mode != "off", "the camera optimizer"),
        (cfg.use_bilateral_grid, "the bilateral grid"),
        (cfg.output_depth_during_training, "depth in training"),
    ]  # fmt: skip
    return next((why for failed, why in checks if failed), None)
