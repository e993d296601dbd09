"""ByteSplat's pipeline: nerfstudio's VanillaPipeline without DDP, plus what several ranks need.

DDP binds the parameter tensors that exist when it is built, and densification replaces them, so a splat
model cannot live in DDP. Here every rank holds the whole model; the ranks stay identical because
- they start identical (`broadcast_from_rank0`, after any checkpoint is loaded),
- their gradients are averaged between backward and the optimizer step (`average_gradients`): the splat
  parameters through sparse-gradient compaction (grad_compaction.py) or, with --pipeline.exchange screen, as each
  view's screen-space gradients (screen_exchange.py), the rest (camera optimizer, bilateral grid) through one dense
  all-reduce,
- densification reads statistics reduced over the ranks and seeded draws (strategy.py).
With one process all of this is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.distributed as dist
from nerfstudio.pipelines.base_pipeline import Pipeline, VanillaPipeline, VanillaPipelineConfig

from bytesplat_ns import screen_exchange
from bytesplat_ns.cuda import ops
from bytesplat_ns.cuda.build import FusedBuildError
from bytesplat_ns.grad_compaction import DenseExchange, ExchangeStats, SparseRowExchange
from bytesplat_ns.input_checks import BadInputError
from bytesplat_ns.screen_exchange import RenderedView, ScreenExchange
from bytesplat_ns.strategy import gather_counts


@dataclass
class ByteSplatPipelineConfig(VanillaPipelineConfig):
    _target: type = field(default_factory=lambda: ByteSplatPipeline)
    exchange: Literal["compact", "screen", "dense"] = "compact"
    """How several GPUs average the splat gradients: compact (only the rows each view touched: sparse-gradient
    compaction), screen (each view's gradients w.r.t. the projected splats, 9 values a splat instead of 59, carried
    back to the parameters on every rank: screen_exchange.py) or dense (one all-reduce of everything, for
    comparison)."""
    half_precision_exchange: bool = False
    """Send the compacted gradient values as float16 (half the bytes; the sum is formed in float32)."""
    exchange_kernels: bool = True
    """Pack and unpack the compacted rows with bytesplat's CUDA kernels (one launch each; built when training starts
    on several GPUs, like the fused renderer) instead of about twenty torch operations: the exchange's host time
    per step 1.53 -> 0.69 ms on lego (benchmarks/RESULTS.md). False: torch operations (no nvcc needed)."""
    exchange_one_step_late: bool = False
    """With several GPUs and the compacted exchange: apply each step's averaged gradients at the next step, so that
    their exchange runs beside the next step's render (late_update.py). Off: on the CPU it cost 0.26 dB held-out
    PSNR (benchmarks/RESULTS.md, forty-first session); not yet run on GPUs."""
    exchange_peer_reads: bool = False
    """With several GPUs of one machine and the compacted exchange: each GPU reads the other GPUs' packed rows from
    their memory (CUDA IPC, over NVLink), as many as each counted, instead of an all-gather of buffers sized for the
    largest recent count; the capacity is then every row, so it never records the step graph again (peer_rows.py).
    Off until measured on two GPUs."""
    exchange_all_to_all_from: int = 4
    """From this many GPUs on, the compacted exchange routes each gradient row to an owner GPU (an all-to-all), which
    sums what it gets and all-gathers the sums; with fewer, every GPU's rows are all-gathered. Chosen by the bytes
    each plan sends on real gradients (benchmarks/exchange_plans.py): the all-gather sends fewer with 2 GPUs, the
    two about the same with 3 unless views overlap much, the routed plan fewer from 4 (grad_compaction.py)."""


class ByteSplatPipeline(VanillaPipeline):
    config: ByteSplatPipelineConfig

    def __init__(
        self,
        config: ByteSplatPipelineConfig,
        device: str,
        test_mode: Literal["test", "val", "inference"] = "val",
        world_size: int = 1,
        local_rank: int = 0,
        grad_scaler: torch.amp.GradScaler | None = None,
    ):
        Pipeline.__init__(self)  # VanillaPipeline's own __init__ would wrap the model in DDP
        self.config, self.test_mode, self.world_size = config, test_mode, world_size
        self.datamanager = config.datamanager.setup(
            device=device, test_mode=test_mode, world_size=world_size, local_rank=local_rank
        )
        metadata = getattr(self.datamanager, "train_dataparser_outputs", None)
        metadata = metadata.metadata if metadata is not None else {}
        seed_points = (metadata["points3D_xyz"], metadata["points3D_rgb"]) if "points3D_xyz" in metadata else None
        self.datamanager.to(device)
        dataset = self.datamanager.train_dataset
        if dataset is None:
            raise BadInputError("The datamanager has no training images.")
        self._model = config.model.setup(
            scene_box=dataset.scene_box,
            num_train_data=len(dataset),
            metadata=dataset.metadata,
            device=device,
            grad_scaler=grad_scaler,
            seed_points=seed_points,
        )
        self.model.to(device)
        self.model.strategy.distributed = world_size > 1
        self.datamanager.view_costs = self.model.bins.entries_by_view  # matched draws (datamanager.py)
        self._other_params: list[torch.nn.Parameter] | None = None
        """The parameters other than the splats', listed when first needed."""
        self.exchange = self._make_exchange(config, device, world_size, dataset)

    def _make_exchange(self, config: ByteSplatPipelineConfig, device: str, world_size: int, dataset):
        """The splat gradients' exchange --pipeline.exchange names (its kernels built now on CUDA)."""
        if config.exchange == "dense":
            return DenseExchange()
        if config.exchange == "screen" and world_size > 1:
            why = screen_exchange.ineligible(self.model, dataset.cameras)
            if why is not None:
                raise BadInputError(
                    f"--pipeline.exchange screen cannot train with {why}. Use --pipeline.exchange compact, or drop "
                    "that option."
                )
            self.model.keeps_screen = True
            return ScreenExchange()
        kernels = config.exchange_kernels and world_size > 1 and torch.device(device).type == "cuda"
        if kernels:
            _build_exchange_kernels()
        late = config.exchange_one_step_late and world_size > 1
        if late:
            self._check_one_step_late(config, world_size)
        peer_reads = config.exchange_peer_reads and world_size > 1
        if peer_reads:
            self._check_peer_reads(config, kernels, late)
        return SparseRowExchange(half=config.half_precision_exchange, kernels=kernels,
                                 all_to_all_from=config.exchange_all_to_all_from, one_step_late=late,
                                 peer_reads=peer_reads)  # fmt: skip

    @staticmethod
    def _check_peer_reads(config: ByteSplatPipelineConfig, kernels: bool, late: bool) -> None:
        """Peers read the rows with the exchange's CUDA kernels, each step's rows in that step (peer_rows.py)."""
        if config.exchange != "compact" or not kernels or late:
            raise BadInputError(
                "--pipeline.exchange-peer-reads True reads the compacted rows with the exchange's CUDA kernels, in "
                "their own step: it needs --pipeline.exchange compact, --pipeline.exchange-kernels True, CUDA GPUs "
                "and --pipeline.exchange-one-step-late False. Change those or drop the option."
            )

    def _check_one_step_late(self, config: ByteSplatPipelineConfig, world_size: int) -> None:
        """The late exchange carries the splat gradients alone, all-gathered (late_update.py)."""
        if config.exchange != "compact":
            raise BadInputError(
                f"--pipeline.exchange-one-step-late True works with --pipeline.exchange compact, not "
                f"{config.exchange}. Use compact or drop the option."
            )
        if world_size >= config.exchange_all_to_all_from:
            raise BadInputError(
                f"--pipeline.exchange-one-step-late True all-gathers the rows; with {world_size} GPUs they would be "
                f"routed to owners. Raise --pipeline.exchange-all-to-all-from above {world_size} or drop the option."
            )
        if self._other_gradient_params():
            raise BadInputError(
                "--pipeline.exchange-one-step-late True exchanges the splat gradients only: it trains without the "
                "camera optimizer and the bilateral grid. Turn them off or drop the option."
            )

    @property
    def exchanges_screen(self) -> bool:
        """The trainer's backward stops at the render's screen-space splats; the exchange carries it on."""
        return isinstance(self.exchange, ScreenExchange)

    def get_train_loss_dict(self, step: int):
        """nerfstudio's, with the batch handed to the model's render (the fused loss path forms the loss there)."""
        camera, batch = self.datamanager.next_train(step)
        return self.train_loss_dict(camera, batch)

    def train_loss_dict(self, camera, batch: dict):
        """-> (outputs, loss_dict, metrics_dict) of one training camera and its batch."""
        outputs = self.model.get_outputs(camera, batch=batch)
        metrics = self.model.get_metrics_dict(outputs, batch)
        return outputs, self.model.get_loss_dict(outputs, batch, metrics), metrics

    def broadcast_from_rank0(self) -> None:
        """Make every rank's model rank 0's: the splat count is checked, then every tensor is broadcast."""
        model = self.model
        counts = gather_counts(model.num_points)
        if len(set(counts)) > 1:
            raise BadInputError(
                f"The ranks built different splat counts {counts}: they read different scenes or checkpoints. "
                "Every rank needs the same --data (and --load-dir) on every machine."
            )
        device = model.means.device  # NCCL moves device tensors only; host-side metric state is identical anyway
        for tensor in model.state_dict().values():
            if torch.is_tensor(tensor) and tensor.device == device:
                dist.broadcast(tensor, src=0)

    def average_gradients(self, note: int = 0, visible: torch.Tensor | None = None) -> ExchangeStats:
        """Mean of every rank's gradients, in place: compacted rows for the splats, all-reduce for the rest
        (--pipeline.exchange dense: one all-reduce for all). No host sync. `note` travels with the exchange (see
        run_control.py); every rank's note of the previous step is in the returned stats. `visible` [N] int32: the
        splats whose gradient rows may be non-zero (model.visible_radii), or None."""
        if self.exchanges_screen:
            return self.exchange.average(self._rendered_view(), note=note, dense=self._other_gradients())
        splat_grads, other_grads = self._gradients()
        columns = self.model.gradient_columns()  # the SH coefficients past the degree in use stay zero: not sent
        return self.exchange.average(splat_grads, note=note, dense=other_grads, visible=visible, columns=columns)

    # The step graph (step_graph.py) records the compacted exchange's device part with the step and runs its host
    # parts around each replay: begin_exchange, (replay: exchange_rows), end_exchange.
    def begin_exchange(self, note: int) -> tuple:
        """-> what the recorded exchange bakes in (SparseRowExchange.begin, ScreenExchange.begin)."""
        params = list(self.model.gauss_params.values())
        if self.exchanges_screen:
            return self.exchange.begin(params, note)
        return self.exchange.begin(params, note, self.model.gradient_columns())

    def exchange_rows(self, visible: torch.Tensor | None = None) -> None:
        if self.exchanges_screen:
            self.exchange.exchange(self._rendered_view())
        else:
            self.exchange.exchange_rows(self._gradients()[0], visible=visible)

    def end_exchange(self) -> ExchangeStats:
        return self.exchange.end()

    def splats_renumbered(self) -> None:
        """Before the splats are edited (model.edits_splats_at): the exchange forgets rows it held back."""
        if isinstance(self.exchange, SparseRowExchange):
            self.exchange.forget_held_rows()

    def pack_for_later(self, visible: torch.Tensor | None = None) -> None:
        """One step late: this step's splat gradient rows packed for the next step's exchange (late_update.py)."""
        self.exchange.pack_for_later(self._gradients()[0], visible=visible)

    def _rendered_view(self) -> RenderedView:
        """This rank's training view for the screen exchange (its backward stopped at the screen-space splats); the
        model lets go of its screen-space splats (and so of the step's autograd graph)."""
        model = self.model
        screen, model.screen = model.screen, None
        return RenderedView(screen, model.train_view[0], model.screen_space, list(model.gauss_params.values()))

    def _gradients(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(the splat parameters' gradients, the other parameters'); zeros for a parameter this rank's step did not
        reach, as on every rank."""
        splat_params = list(self.model.gauss_params.values())  # densification replaces these: listed each step
        for param in splat_params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        return [p.grad for p in splat_params], self._other_gradients()

    def _other_gradient_params(self) -> list[torch.nn.Parameter]:
        """The parameters other than the splats' (camera optimizer, bilateral grid)."""
        if self._other_params is None:  # the same tensors all run long
            splat_ids = {id(p) for p in self.model.gauss_params.values()}
            groups = self.get_param_groups().values()
            self._other_params = [p for group in groups for p in group if id(p) not in splat_ids]
        return self._other_params

    def _other_gradients(self) -> list[torch.Tensor]:
        """The gradients of the parameters other than the splats' (camera optimizer, bilateral grid); zeros where
        this rank's step did not reach one."""
        params = self._other_gradient_params()
        for param in params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        return [p.grad for p in params]


def _build_exchange_kernels() -> None:
    """Build (or load) the CUDA extension now rather than at the first exchange; fail with both fixes."""
    try:
        ops.ext()
    except FusedBuildError as error:
        hint = "Or exchange without the kernels: --pipeline.exchange-kernels False."
        raise FusedBuildError(f"{error}\n{hint}") from error
