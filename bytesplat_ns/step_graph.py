"""The steady-state training step recorded once as a CUDA graph and replayed (issue #6).

On a fast GPU the training step is bound by the host: some two hundred kernel launches, each behind Python and
torch's dispatch, while the GPU's own work takes a fraction of that time (benchmarks/RESULTS.md). A CUDA graph
records the step's GPU work once (render, fused loss, backward, densification statistics, non-finite guard, Adam)
and replays it with one launch. What the host still does per step: take the next camera, write its row of the
stored camera matrices and images (camera_matrices.py) into the graph's index (or, images not stored on the device,
copy its image in), write changed learning rates on the device (and the step number, after a step op by op: the
graph advances it itself), replay, and queue the binning's entry count for its late read (render/bin_capacity.py).
Refines, logging, evaluation and checkpoints run as before, between replays.

A graph bakes in tensor addresses, shapes and Python decisions, so it is recorded again when one of them changes:
- the splat parameters, their optimizer state or the densification statistics (a non-finite restore, and
  densification or an opacity reset unless the splats' rows are held at a capacity on rungs and the count keeps its
  rung, splat_rows.py: new tensors), the SH degree, the resolution (splatfacto's downscale schedule; it also fixes
  the fused kernels' tile side), the image's shape, whether densification statistics are still gathered (step <
  refine_stop_iter);
- the binning asks for more entries than the graph's buffers hold (their capacity is recorded rounded up to a rung,
  capacity_rungs.py, so the few percent a view's entry count drifts do not record it again).
The step right after densification changed the rows bins exactly (one host read) and runs eagerly; so does a
step whose batch takes another loss path (masks), the first step of any new configuration (lazy set-up of
libraries on a shape's first use cannot happen inside a recording), and, one step late, a step with no rows
pending. The next step records the graph and replays it.
Everything recorded must run on the recording stream: gsplat 1.4.0's SH kernels launch on the legacy default
stream, which a graph does not record (they would run once, at recording, and leave their output stale), so
the fused renderer evaluates SH with its own kernels (csrc/sh.h); the ground truth's downscale avoids
cuDNN for the same kind of reason (model.py). tests/test_step_graph.py holds a replayed step to the same step run
op by op.

Several GPUs (one process each): the graph holds the compacted gradient exchange's device part (pack, NCCL
all-gather, unpack; from `--pipeline.exchange-all-to-all-from` GPUs a routing round first: pack per owner, NCCL
all-to-all, sum; or, peers reading the rows, a barrier, pack, a barrier, unpack from the peers' memory:
peer_rows.py) between backward and Adam. Its host parts run around each replay: before,
the late read of earlier headers sets the capacity and this step's note goes into a device tensor; after, the
gathered headers start their copy to the host. The graph is recorded again when a capacity or a residual
buffer changes, or the exchange turns into a dense all-reduce or back (grad_compaction.py); all follow from the
gathered counts, so they change at the same step on every rank. One step late (late_update.py) the graph holds the
all-gather and unpack of the step before's rows on a side stream beside the render, then Adam on their mean, then
the pack of this step's rows. Ranks may record at different steps (their binning capacities differ): a recording
runs nothing, and every step, replayed or eager, makes the same collectives on every rank (the all-gather, after
the all-to-all when routed, or the dense all-reduce), so they stay matched.

Used with CUDA processes on the fused loss path (several: with the compacted exchange and its kernels), with the
one-launch Adam (adam_all_groups.py: it reads
its learning rates from a device tensor the trainer refreshes before each step), the camera optimizer off, no scale
regularisation, no mixed precision and no gradient accumulation (`ineligible` says which is missing; the trainer
then runs every step eagerly). --cuda-graph False turns it off.
"""

from __future__ import annotations

import copy
import gc
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from bytesplat_ns.camera_matrices import INTRINSICS, VIEWMAT, CameraStack
from bytesplat_ns.capacity_rungs import rung_above
from bytesplat_ns.datamanager import ByteSplatDatamanager
from bytesplat_ns.grad_compaction import SparseRowExchange
from bytesplat_ns.screen_exchange import ScreenExchange

StepBody = Callable[[Tensor, object, dict], tuple]
"""(step as a [] int64 device tensor, camera, batch) -> (loss, loss_dict, metrics_dict): the step's forward,
backward, densification statistics, guard and optimizer update, as the trainer runs it eagerly."""


class StepGraphError(RuntimeError):
    """Recording the training step as a CUDA graph failed."""


def ineligible(trainer) -> str | None:
    """Why `trainer`'s steps cannot be replayed as a graph (None: they can)."""
    model, exchange = trainer.pipeline.model, trainer.pipeline.exchange
    cfg = model.config
    checks = [
        (not trainer.device.startswith("cuda"), "training on the CPU"),
        (trainer.world_size > 1 and not trainer.config.cuda_graph_several_gpus,
         "several GPUs with --cuda-graph-several-gpus False"),
        (trainer.world_size > 1 and not (isinstance(exchange, ScreenExchange)
                                         or isinstance(exchange, SparseRowExchange) and exchange.kernels),
         "several processes with the dense exchange, or the compacted one without its kernels (--pipeline.exchange "
         "dense, or --pipeline.exchange-kernels False)"),
        (model.renderer() != "fused" or not cfg.fused_loss, "the renderer is not the fused loss path"),
        (cfg.use_bilateral_grid or cfg.output_depth_during_training, "the bilateral grid or depth in training"),
        (cfg.camera_optimizer.mode != "off", "the camera optimizer is on"),
        (not isinstance(trainer.pipeline.datamanager, ByteSplatDatamanager),
         "the datamanager is not bytesplat's (it stores the camera matrices the graph reads)"),
        (cfg.use_scale_regularization, "scale regularisation (every 10th step differs)"),
        (trainer.mixed_precision, "mixed precision"),
        (trainer.accumulates_gradients, "gradient accumulation"),
        (trainer.adam is None, f"the one-launch Adam is off ({trainer.adam_off})"),
    ]  # fmt: skip
    return next((why for failed, why in checks if failed), None)


@dataclass
class _FixedBins:
    """Stands in for the model's BinCapacity while recording: a fixed capacity, the count tensor kept."""

    capacity: int
    total: Tensor | None = None  # [1] the recorded binning's entry count

    def next(self, num_splats: int, tile_size: int) -> int:
        return self.capacity

    def observe(self, total: Tensor, capacity: int) -> None:
        self.total = total


class _GraphInputs:
    """The camera and batch the graph reads. The camera's matrices are its rows of the datamanager's CameraStack
    (camera_matrices.py), gathered inside the graph by a device index written before each replay; so is the image
    where the stack holds the images, else it is copied into a buffer of the graph's before each replay."""

    def __init__(self, camera, batch: dict, stack: CameraStack) -> None:
        self.stack = stack
        self.index = torch.zeros(1, dtype=torch.int64, device=stack.viewmats.device)  # [1] the camera's row
        self.camera = copy.copy(camera)  # the model reads only the size and the matrices of a training camera
        self.camera.metadata = {k: v for k, v in camera.metadata.items() if k != "cam_idx"}  # the recorded one's
        self.batch = dict(batch)
        self.image = None if stack.images is not None else batch["image"].clone()

    def gathered(self) -> tuple:
        """-> (camera, batch) read through the index; called while recording, so the gathers are in the graph."""
        self.camera.metadata[VIEWMAT] = self.stack.viewmats.index_select(0, self.index)  # [1, 16]
        self.camera.metadata[INTRINSICS] = self.stack.intrinsics.index_select(0, self.index)  # [1, 9]
        images = self.stack.images
        self.batch["image"] = self.image if images is None else images.index_select(0, self.index)[0]
        return self.camera, self.batch

    def load(self, camera, batch: dict) -> None:
        self.index.fill_(self.stack.rows[camera.metadata["cam_idx"]])
        if self.image is not None:
            self.image.copy_(batch["image"])


class StepGraph:
    def __init__(self, trainer, body: StepBody) -> None:
        self.pipeline = trainer.pipeline
        self.model = trainer.pipeline.model
        self.optimizers = trainer.optimizers
        self.body = body
        self.late = trainer.late  # one step late: what the recorded step bakes in from it is part of exchange_key
        device = self.model.device
        self.graph: torch.cuda.CUDAGraph | None = None
        self.key: tuple | None = None
        self.exchange_key: tuple | None = None  # several ranks: what the recorded exchange baked in
        self._eager_key: tuple | None = None  # the configuration of the last step run op by op
        self.outputs: tuple | None = None
        self.inputs: _GraphInputs | None = None
        self.bins: _FixedBins | None = None
        self.info: tuple | None = None
        self.stream = torch.cuda.Stream(device=device)
        self.step = torch.zeros((), dtype=torch.int64, device=device)  # the guard's step number in the graph
        self._step_value: int | None = None  # what `step` holds once the queued work has run (None: not known)
        self.replays = 0
        self.record_seconds = 0.0
        self.eager: Counter[str] = Counter()
        """Steps run op by op, by reason."""
        self.recorded: Counter[str] = Counter()
        """Recordings, by reason."""

    def run(self, step: int, camera, batch: dict, note: int | None = None) -> tuple | None:
        """Replay (recording first if needed) the step on `camera` and `batch`; `note`: this rank's note for the
        exchange (several ranks) or None (one). -> ((loss, loss_dict, metrics_dict), the exchange's stats or None),
        or None when this step must run eagerly (the eager step makes new gradients: the graph is stale then)."""
        key = self._key(camera, batch)
        bins = self.model.bins
        why = (
            "another loss path" if key is None
            else "exact binning" if bins.needs_exact(self.model.num_rows)
            else "new optimizer state" if not self._optimizer_state_ready()
            else "nothing pending one step late" if self.late is not None and not self.late.pending
            else None
        )  # fmt: skip
        if why is None and key != self.key and key != self._eager_key:  # runs op by op once first: lazy set-up
            why = "new configuration"  # on a first use (library handles, algorithm choices) cannot be recorded
        if why is not None:
            self.eager[why] += 1
            self._eager_key = key
            self._forget()
            return None
        wanted = bins.next(self.model.num_rows, bins.tile_size)  # the side of the step before: same resolution
        exchange_key = self.pipeline.begin_exchange(note) if note is not None else None
        if self.late is not None:
            exchange_key = (exchange_key, self.late.key())
        stale = (
            "after a step op by op" if self.key is None
            else "new splat tensors" if key[0] != self.key[0]
            else "new SH degree, resolution or phase" if key != self.key
            else "exchange plan" if exchange_key != self.exchange_key
            else "binning capacity" if wanted > self.bins.capacity
            else None
        )  # fmt: skip
        if stale is not None:
            self.recorded[stale] += 1
            self._record(key, camera, batch, rung_above(wanted, bins.granule))
            self.exchange_key = exchange_key
        self.inputs.load(camera, batch)
        if step != self._step_value:  # the graph advances `step` as its last op: no launch between replays
            self.step.fill_(step)
        self.graph.replay()
        self._step_value = step + 1
        bins.view = camera.metadata.get("cam_idx")
        bins.observe(self.bins.total, self.bins.capacity)
        self.model.info, self.model.pruned = self.info  # an evaluation or viewer render since may have replaced them
        self.replays += 1
        return self.outputs, self.pipeline.end_exchange() if note is not None else None

    @property
    def captures(self) -> int:
        """Recordings made."""
        return sum(self.recorded.values())

    def summary(self) -> str:
        eager = ", ".join(f"{n} {why}" for why, n in self.eager.items())
        recorded = ", ".join(f"{n} {why}" for why, n in self.recorded.most_common())
        return (f"{self.replays:,} steps replayed, {self.captures} recordings ({self.record_seconds:.1f} s: "
                f"{recorded or 'none'}); op by op: {eager or 'none'}")  # fmt: skip

    def release(self) -> None:
        """Free the recorded graph and its memory pool, at the end of training. With several GPUs a graph that
        recorded an NCCL collective holds the communicator: destroying the process group (nerfstudio's launcher does
        after training) waits until every such graph is gone, for ever while the trainer keeps this one. Does not
        wait for the GPU (a graph still running is freed when it ends)."""
        self._forget()
        if self.graph is not None:
            self.graph.reset()
            self.graph = None

    def _forget(self) -> None:
        """Mark the graph stale and drop what points into its buffers. The graph itself stays until the next
        recording, which reuses its memory pool (a new pool per recording would allocate and free every buffer)."""
        self.key = self.exchange_key = self.outputs = self.inputs = self.bins = self.info = None

    def _record(self, key: tuple, camera, batch: dict, capacity: int) -> None:
        began = time.perf_counter()
        old, self.graph = self.graph, None
        self._forget()
        for param in self._params():
            param.grad = None  # the graph's backward makes its own (static) gradients
        self.inputs = _GraphInputs(camera, batch, self.pipeline.datamanager.camera_stack)
        self.bins = _FixedBins(capacity)
        self.model.info = self.model.screen = None  # the last eager step's autograd graph must be gone: its gradient
        # accumulators belong to the default stream, which a recording may not touch
        model_bins, self.model.bins = self.model.bins, self.bins
        graph = torch.cuda.CUDAGraph()
        self.stream.wait_stream(torch.cuda.current_stream())
        # Python's cycle collector runs at any allocation; inside the recording it could free garbage that holds
        # CUDA resources (an old trainer's graph) with CUDA calls a capturing thread may not make. A destructor
        # cannot raise, so the recording would fail later, at an unrelated op: no automatic collection meanwhile.
        collecting = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.stream(self.stream):
                graph.capture_begin(pool=old.pool() if old is not None else None, capture_error_mode="thread_local")
                try:
                    outputs = self.body(self.step, *self.inputs.gathered())
                    self.step.add_(1)  # the next step's number, read by nothing after it in the step
                finally:
                    graph.capture_end()
        except RuntimeError as error:
            raise StepGraphError(
                f"Recording the training step as a CUDA graph failed: {error}\nTrain without it: --cuda-graph False "
                "(and please report this with the command you ran)."
            ) from error
        finally:
            self.model.bins = model_bins
            if collecting:
                gc.enable()
        torch.cuda.current_stream().wait_stream(self.stream)
        if old is not None:
            old.reset()  # never replayed again: the new graph has taken over its pool
        self.graph, self.key, self.outputs = graph, key, detach_outputs(outputs)
        self.info = (_detached_info(self.model.info), self.model.pruned)  # the recorded render's, for densification
        self.record_seconds += time.perf_counter() - began

    def _key(self, camera, batch: dict) -> tuple | None:
        """What the graph bakes in that can change during training; None: this batch takes another path."""
        model = self.model
        if not model.uses_fused_loss(batch):
            return None
        tensors = []
        for optimizer in self.optimizers.optimizers.values():
            for param in self._group_params(optimizer):
                state = optimizer.state.get(param, {})
                tensors += [param, *(state.get(name) for name in ("exp_avg", "exp_avg_sq", "step"))]
        tensors += [model.strategy_state.get(name) for name in ("grad2d", "count", "radii")]  # None: made eagerly
        image = batch["image"]
        # The fused kernels' tile side (16 or 8 pixels, cuda/ops.py tile_size_for) is not an entry of its own: it
        # follows from the render's size alone, which the downscale factor and the camera's size below fix.
        return (
            tuple((t.data_ptr(), tuple(t.shape)) if t is not None else None for t in tensors),
            model.sh_degree_now(),
            model._get_downscale_factor(),
            model.step < model.strategy.refine_stop_iter,
            tuple(image.shape), image.dtype, camera.metadata.get("size"),
        )  # fmt: skip

    def _optimizer_state_ready(self) -> bool:
        """Adam creates its state at a parameter's first step; that must not happen inside the graph."""
        return all(
            optimizer.state.get(param) for optimizer in self.optimizers.optimizers.values()
            for param in self._group_params(optimizer)
        )  # fmt: skip

    @staticmethod
    def _group_params(optimizer: torch.optim.Optimizer) -> list[Tensor]:
        return [param for group in optimizer.param_groups for param in group["params"]]

    def _params(self) -> list[Tensor]:
        return [param for optimizer in self.optimizers.optimizers.values() for param in self._group_params(optimizer)]


def detach_outputs(outputs: tuple) -> tuple:
    """(loss, loss_dict, metrics_dict) without their autograd graph (which would keep the recording's gradient
    accumulators, on the recording stream, alive into later eager steps)."""
    loss, loss_dict, metrics_dict = outputs
    detach = lambda d: {k: v.detach() if torch.is_tensor(v) else v for k, v in d.items()}  # noqa: E731
    return loss.detach(), detach(loss_dict), detach(metrics_dict)


def _detached_info(info: dict) -> dict:
    """The render's densification info with a detached 2D-means tensor that carries the same .grad and .absgrad."""
    means2d = info["means2d"]
    held = means2d.detach()
    held.grad = means2d.grad
    if hasattr(means2d, "absgrad"):
        held.absgrad = means2d.absgrad
    return {**info, "means2d": held}
