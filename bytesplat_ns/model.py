"""ByteSplat model: splatfacto's Gaussians, losses and densification, rendered through `rasterize()`.

A SplatfactoModel subclass that keeps splatfacto's parameter names, so ns-export, ns-render and the
viewer treat it as a splat model. Differences: the renderer is chosen by config, nothing needs CUDA,
nothing is compiled or downloaded on construction, and checkpoints resume into the same parameters.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from gsplat.strategy.ops import remove
from nerfstudio.cameras.cameras import Cameras
from nerfstudio.model_components.lib_bilagrid import color_correct, total_variation_loss
from nerfstudio.models.splatfacto import (
    RGB2SH,
    SplatfactoModel,
    SplatfactoModelConfig,
    num_sh_bases,
    random_quat_tensor,
)
from torch import Tensor

from bytesplat_ns import nerfstudio_patches
from bytesplat_ns.camera_matrices import (
    IntrinsicsScale,
    intrinsics_matrix,
    stored_matrices,
    viewmat_from_camera_to_world,
)
from bytesplat_ns.lpips import lpips_if_weights_on_disk
from bytesplat_ns.render import Backend, RasterCamera, RasterizeOptions, Splats, rasterize
from bytesplat_ns.render.bin_capacity import BinCapacity
from bytesplat_ns.render.fused_backend import FusedLoss, fused_loss_step
from bytesplat_ns.render.rasterize import resolve_backend
from bytesplat_ns.render.screen_space import screen_space
from bytesplat_ns.render.types import ScreenSplats
from bytesplat_ns.splat_ply import read_splats
from bytesplat_ns.splat_rows import SplatRows
from bytesplat_ns.ssim import SSIMTerm
from bytesplat_ns.strategy import ByteSplatStrategy

GAUSSIAN_PARAMS = ("means", "scales", "quats", "features_dc", "features_rest", "opacities")


def neighbour_distances(points: Tensor, k: int) -> Tensor:
    """[N, 3] -> [N, k] float32: each point's distances to its k nearest other points, as splatfacto's
    k_nearest_sklearn gives them (its initial scales), from scipy's KD-tree queried on every core: the same numbers
    as sklearn's single-threaded search, seconds sooner for millions of points."""
    from scipy.spatial import cKDTree

    if points.shape[0] <= k:
        raise ValueError(
            f"{points.shape[0]} initial points: sizing the splats needs at least {k + 1} (each from its {k} nearest "
            "neighbours). Start from random points with --pipeline.model.random-init True."
        )
    cloud = points.detach().cpu().numpy()
    distances, _ = cKDTree(cloud).query(cloud, k=k + 1, workers=-1)
    return torch.from_numpy(distances[:, 1:]).float()


@dataclass
class ByteSplatModelConfig(SplatfactoModelConfig):
    """Splatfacto's options plus the choice of renderer."""

    _target: type = field(default_factory=lambda: ByteSplatModel)
    renderer: Backend = "auto"
    """Rasterizer backend: torch (pure-PyTorch reference, any device), gsplat (gsplat's CUDA rasterizer), fused
    (bytesplat's fused CUDA kernels, built at the first step), or auto (fused on CUDA, torch on CPU)."""
    max_splats: int = 0
    """Cap on the splat count: after each refine the lowest-opacity splats beyond it are removed (0: no cap)."""
    init_splats: Path | None = None
    """Start from a splat PLY exported by ns-export gaussian-splat (same scene and dataparser) instead of points."""
    views_per_step: int = 1
    """Training views per optimizer step (the number of GPUs). Set by the trainer, not on the command line."""
    fused_loss: bool = True
    """With the fused renderer (auto on CUDA): form the loss's per-pixel gradient inside the fused kernel
    (render/fused_backend.py fused_loss_step) instead of autograd through the rendered image. Training falls
    back to autograd with masks, the bilateral grid or depth output during training."""
    ssim_kernel: bool = True
    """On CUDA, the loss's SSIM term through bytesplat's kernels (one launch forward, one backward; built at the
    first training step, like the fused renderer) instead of pytorch_msssim's tens of launches: same value and
    gradient (bytesplat_ns/ssim.py). False: pytorch_msssim, as splatfacto (no nvcc needed)."""
    prune_on_chip: bool = False
    """With the fused renderer (auto on CUDA): a tile with more splats than fit in on-chip memory keeps those that
    contribute most there (shared-memory-aware pruning) instead of compositing long tiles in chunks. Off: on lego
    (7000 steps, H200) it keeps held-out PSNR (+0.11 dB mean over seeds 42-47 against the same runs without it,
    twenty-first session) but saved no step time (seventh session; benchmarks/RESULTS.md)."""
    random_background_in_training: bool = False
    """Composite each training view's render and ground truth over a new random colour every step, while
    evaluation, the viewer and renders keep --pipeline.model.background-color. Needs images with an alpha channel
    (for blender scenes: `blender-data --alpha-color None`). On a white background a white splat in empty space
    costs nothing in the training views and can veil a test view; on random colours it costs loss. Off: on lego
    (7000 steps, H200, seeds 44-49) the seed with such a splat gained 0.96 dB test PSNR, the other five lost
    0.16-0.50 dB (mean -0.08 dB; benchmarks/RESULTS.md, twenty-second session)."""


class SplatOutOfMemoryError(RuntimeError):
    """The GPU ran out of memory while densifying; the trainer saves a checkpoint and says what to lower."""

    def __init__(self, step: int, num_splats: int) -> None:
        super().__init__(f"out of GPU memory while densifying at step {step} with {num_splats} splats")
        self.step, self.num_splats = step, num_splats


def psnr(pred: Tensor, gt: Tensor) -> Tensor:
    """PSNR for images in [0, 1], as torchmetrics' PeakSignalNoiseRatio(data_range=1.0) over one image pair."""
    return -10.0 * torch.log10(torch.mean((pred - gt) ** 2))


def sh_rest_values(degree: int) -> int:
    """Values of a splat's features_rest ([K - 1, 3] SH coefficients past the first) that SH `degree` uses."""
    return 3 * (num_sh_bases(degree) - 1)


class ByteSplatModel(SplatfactoModel):
    config: ByteSplatModelConfig

    def populate_modules(self) -> None:
        nerfstudio_patches.patch_loaded_exporter()  # ns-export: the vectorised PLY writer
        self.gauss_params = torch.nn.ParameterDict(self._initial_gaussians())
        self.camera_optimizer = self.config.camera_optimizer.setup(num_cameras=self.num_train_data, device="cpu")
        from torchmetrics.image import PeakSignalNoiseRatio

        self.psnr = PeakSignalNoiseRatio(data_range=1.0)
        self.ssim_term = SSIMTerm(kernel=self.config.ssim_kernel)  # training loss
        self.ssim = self.ssim_term.module  # eval metric: pytorch_msssim's module, as splatfacto
        self.lpips = lpips_if_weights_on_disk()
        self.step = 0
        self.crop_box = None
        self.background_color = (
            torch.tensor([0.1490, 0.1647, 0.2157])  # viser's background, used when rendering for eval
            if self.config.background_color == "random"
            else torch.tensor({"white": [1.0, 1.0, 1.0], "black": [0.0, 0.0, 0.0]}[self.config.background_color])
        )
        if self.config.use_bilateral_grid:
            from nerfstudio.model_components.lib_bilagrid import BilateralGrid

            x, y, w = self.config.grid_shape
            self.bil_grids = BilateralGrid(num=self.num_train_data, grid_X=x, grid_Y=y, grid_W=w)
        cfg = self.config
        self.strategy = ByteSplatStrategy(  # splatfacto's densification, option for option; see strategy.py
            prune_opa=cfg.cull_alpha_thresh,
            grow_grad2d=cfg.densify_grad_thresh,
            grow_scale3d=cfg.densify_size_thresh,
            grow_scale2d=cfg.split_screen_size,
            prune_scale3d=cfg.cull_scale_thresh,
            prune_scale2d=cfg.cull_screen_size,
            refine_scale2d_stop_iter=cfg.stop_screen_size_at,
            refine_start_iter=cfg.warmup_length,
            refine_stop_iter=cfg.stop_split_at,
            reset_every=cfg.reset_alpha_every * cfg.refine_every,
            refine_every=cfg.refine_every,
            pause_refine_after_reset=self.num_train_data // cfg.views_per_step + cfg.refine_every,
            absgrad=cfg.use_absgrad,
            revised_opacity=False,
            verbose=True,
        )
        self.strategy_state = self.strategy.initialize_state(scene_scale=1.0)
        self.loaded_views_per_step = cfg.views_per_step
        self.pruned: Tensor | None = None  # set by each render (fused renderer: a device tensor)
        self.keeps_screen = False
        """Keep each training render's screen-space splats in `screen` (for the screen exchange to read their
        gradients); off otherwise, since they hold the step's autograd graph."""
        self.screen: ScreenSplats | None = None
        self.train_view: tuple[RasterCamera, RasterizeOptions] | None = None
        """The last training render's camera and options."""
        self.bins = BinCapacity()  # fused renderer, training: tile binning without a host sync
        self.scale_intrinsics = IntrinsicsScale()
        self.rows: SplatRows | None = None
        """The splats' rows held at a capacity on rungs (splat_rows.py; the trainer turns it on with the step
        graph), or None: the tensors hold the live splats only."""

    def _initial_gaussians(self) -> dict[str, torch.nn.Parameter]:
        """Splatfacto's initialisation (seed points or a random cube), or an exported PLY; built on the CPU."""
        cfg = self.config
        if cfg.init_splats is not None:
            tensors = read_splats(cfg.init_splats)
            k = num_sh_bases(cfg.sh_degree) - 1
            rest = tensors["features_rest"][:, :k]
            tensors["features_rest"] = torch.cat([rest, rest.new_zeros(rest.shape[0], k - rest.shape[1], 3)], dim=1)
            return {name: torch.nn.Parameter(t.contiguous()) for name, t in tensors.items()}
        seeded = self.seed_points is not None and not cfg.random_init
        means = self.seed_points[0].float() if seeded else (torch.rand(cfg.num_random, 3) - 0.5) * cfg.random_scale
        scales = torch.log(neighbour_distances(means, 3).mean(dim=-1, keepdim=True)).repeat(1, 3)
        n, dim_sh = means.shape[0], num_sh_bases(cfg.sh_degree)
        shs = torch.zeros(n, dim_sh, 3)
        if seeded and self.seed_points[1].shape[0] > 0:
            rgb = self.seed_points[1].float() / 255.0
            shs[:, 0] = RGB2SH(rgb) if cfg.sh_degree > 0 else torch.logit(rgb, eps=1e-10)
        else:
            shs[:, 0] = torch.rand(n, 3)
        tensors = {
            "means": means,
            "scales": scales,
            "quats": random_quat_tensor(n),
            "features_dc": shs[:, 0],
            "features_rest": shs[:, 1:],
            "opacities": torch.logit(0.1 * torch.ones(n, 1)),
        }
        return {name: torch.nn.Parameter(t.contiguous()) for name, t in tensors.items()}

    def load_state_dict(self, state_dict, **kwargs):  # type: ignore[override]
        """Resize the Gaussians in place to the checkpoint's count, then load.

        Resizing in place keeps the Parameter objects the optimizers already hold, so a resumed run keeps
        training them (replacing them, as splatfacto does, leaves the optimizers stepping stale tensors).
        """
        self.step = 30000  # as splatfacto: a loaded model renders at full resolution and full SH degree
        n = state_dict["gauss_params.means"].shape[0]
        for param in self.gauss_params.values():
            param.data = param.data.new_zeros((n, *param.shape[1:]))
        return torch.nn.Module.load_state_dict(self, state_dict, **kwargs)

    @property
    def num_points(self) -> int:
        """The live splat count (with rows held, the tensors have more rows: `num_rows`)."""
        return self.rows.live if self.rows is not None else self.num_rows

    @property
    def num_rows(self) -> int:
        """Rows of the splat tensors: what a render projects, bins and returns statistics for."""
        return self.means.shape[0]

    def hold_rows(self, optimizers: dict[str, torch.optim.Optimizer]) -> None:
        """From now on hold the splats' rows at a capacity on rungs (splat_rows.py). `optimizers`: the trainer's,
        by parameter name (splatfacto's step callback sets the same dict before every step)."""
        self.optimizers = optimizers
        self.rows = SplatRows(live=self.num_rows)
        self.rows.hold(self.gauss_params, self.optimizers, self.strategy_state)

    def recount_rows(self) -> None:
        """With rows held: count the live splats anew after the tensors were replaced wholesale (the non-finite
        guard's restore; one host sync)."""
        if self.rows is not None:
            self.rows.recount(self.opacities)

    @contextmanager
    def live_rows(self):
        """Within: the splat tensors, their moments and statistics hold the live splats only, as gsplat's
        operations and checkpoints expect; after: held again (in the same tensors while the count keeps its rung).
        Not held again after an exception (the trainer stops on it)."""
        if self.rows is None:
            yield
            return
        held = self.rows.release(self.gauss_params, self.optimizers, self.strategy_state)
        yield
        self.rows.hold(self.gauss_params, self.optimizers, self.strategy_state, held)

    def edits_splats_at(self, step: int) -> bool:
        """Whether `step_post_backward` edits the splats at `step` (refine, opacity reset or the splat cap)."""
        return self.strategy.edits_splats_at(step) or 0 < self.config.max_splats < self.num_points

    def step_post_backward(self, step: int) -> None:
        """Densify (ByteSplatStrategy: gsplat's DefaultStrategy schedule, as splatfacto), then keep the splat count
        under max_splats."""
        if not self.edits_splats_at(step):
            return
        try:
            with self.live_rows():
                super().step_post_backward(step)
                excess = self.num_rows - self.config.max_splats  # the live splats, here
                if self.config.max_splats > 0 and excess > 0:
                    weakest = torch.topk(self.opacities.detach().squeeze(-1), excess, largest=False).indices
                    mask = torch.zeros(self.num_rows, dtype=torch.bool, device=self.means.device)
                    mask[weakest] = True
                    remove(self.gauss_params, self.optimizers, self.strategy_state, mask)
        except torch.OutOfMemoryError as error:
            raise SplatOutOfMemoryError(step, self.num_rows) from error

    def accumulate_densification_statistics(self) -> None:
        """Add this training step's render to the densification statistics; called by the trainer right after
        backward (the step graph records it), before the after-iteration callback refines (strategy.py)."""
        if self.info is not None:
            self.strategy.accumulate(self.gauss_params, self.strategy_state, self.info, self.step)

    def visible_radii(self) -> Tensor | None:
        """[N] int32: the last render's screen radii, 0 for a culled splat, whose gradient row is then zero as long
        as the loss reaches the splats only through the render (the compacted exchange skips such rows unread,
        grad_compaction.py). None where that does not hold (scale regularisation) or no render of all N splats is
        at hand."""
        radii = self.info["radii"] if self.info is not None else None
        if radii is None or self.config.use_scale_regularization or tuple(radii.shape) != (1, self.num_rows):
            return None
        return radii.reshape(-1)

    def get_extra_state(self) -> dict:
        """Densification statistics travel in checkpoints, so a resumed run densifies as the original would; and
        the views per step, so a run on another number of GPUs can convert the step count (view_schedule.py)."""
        state = {k: v for k, v in self.strategy_state.items() if v is None or torch.is_tensor(v)}
        return {**state, "views_per_step": self.config.views_per_step}

    def set_extra_state(self, state: dict) -> None:
        state = dict(state)
        self.loaded_views_per_step = int(state.pop("views_per_step", 1))
        self.strategy_state.update({k: v if v is None else v.to(self.device) for k, v in state.items()})

    def splats(self, crop_ids: Tensor | None = None) -> Splats:
        """The Gaussians, activated, optionally restricted to crop_ids."""
        pick = (lambda t: t) if crop_ids is None else (lambda t: t[crop_ids])  # noqa: E731
        sh = self.config.sh_degree > 0
        return Splats(
            means=pick(self.means),
            quats=pick(self.quats),
            scales=torch.exp(pick(self.scales)),
            opacities=torch.sigmoid(pick(self.opacities)).squeeze(-1),
            colors=pick(self.features_dc) if sh else torch.sigmoid(pick(self.features_dc)),  # [N, 3]
            sh_rest=pick(self.features_rest) if sh else None,  # [N, K - 1, 3], not joined to features_dc
        )

    def get_outputs(self, camera: Cameras, batch: dict | None = None) -> dict[str, Tensor | list]:
        """Render `camera`. With the training `batch` and the fused loss path on (`uses_fused_loss`), the loss is
        formed while rendering and returned as outputs["fused_loss"]."""
        if not isinstance(camera, Cameras):
            raise TypeError(f"ByteSplatModel renders Cameras, got {type(camera).__name__}.")
        if self.training and camera.shape[0] != 1:
            raise ValueError(f"Training renders one camera at a time, got {camera.shape[0]}.")
        stored = self._stored_matrices(camera)

        crop_ids = None
        if self.crop_box is not None and not self.training:
            crop_ids = self.crop_box.within(self.means).squeeze()
            if crop_ids.sum() == 0:
                return self.get_empty_outputs(
                    int(camera.width.item()), int(camera.height.item()), self.background_color
                )

        downscale = self._get_downscale_factor()
        if stored is not None:
            viewmat, K = stored[0], self.scale_intrinsics(stored[1], downscale)  # [4, 4], [3, 3]
        else:
            c2w = self.camera_optimizer.apply_to_camera(camera)[0] if self.training else camera.camera_to_worlds[0]
            viewmat = viewmat_from_camera_to_world(c2w)  # [4, 4] from [3, 4]
            K = intrinsics_matrix(camera, downscale).to(self.device)  # [3, 3]
        size = (camera.metadata or {}).get("size")  # training cameras: Python ints, no host sync
        if size is not None:
            width, height = size[0] // downscale, size[1] // downscale
        else:
            camera.rescale_output_resolution(1 / downscale)  # nerfstudio's rounding of the scaled size
            width, height = int(camera.width.item()), int(camera.height.item())
            camera.rescale_output_resolution(downscale)
        self.last_size = (height, width)

        background = self._get_background_color()
        render_depth = self.config.output_depth_during_training or not self.training
        opts = RasterizeOptions(
            sh_degree=self.sh_degree_now() if self.config.sh_degree > 0 else None,
            background=background,
            render_depth=render_depth,
            absgrad=self.strategy.absgrad,
            backend=self.config.renderer,
            bins=self.bins if self.training else None,
            prune_on_chip=self.config.prune_on_chip,
        )
        raster_camera = RasterCamera(viewmat, K, width, height)
        if self.training:
            self.train_view = (raster_camera, opts)
            self.bins.view = (camera.metadata or {}).get("cam_idx")  # its binning's count is kept per camera
        if batch is not None and self.uses_fused_loss(batch):
            return self._fused_loss_outputs(raster_camera, opts, batch)
        out = rasterize(self.splats(crop_ids), raster_camera, opts)
        self.info = out.strategy_info()
        self._keep_screen(out.screen)
        self.pruned = out.pruned  # fused renderer: tile entries dropped by on-chip pruning (device tensor)
        if self.training:
            self.strategy.step_pre_backward(
                self.gauss_params, self.optimizers, self.strategy_state, self.step, self.info
            )

        rgb = torch.clamp(out.rgb, 0.0, 1.0)
        if self.config.use_bilateral_grid and self.training and camera.metadata and "cam_idx" in camera.metadata:
            rgb = self._apply_bilateral_grid(rgb[None], camera.metadata["cam_idx"], height, width)[0]
        depth = None
        if out.depth is not None:
            depth = torch.where(out.alpha > 0, out.depth, out.depth.detach().max())
        if not self.training:
            background = background.expand(height, width, 3)
        return {"rgb": rgb, "depth": depth, "accumulation": out.alpha, "background": background}

    def _keep_screen(self, screen: ScreenSplats | None) -> None:
        if self.training and self.keeps_screen:
            self.screen = screen

    def screen_space(self, camera: RasterCamera) -> ScreenSplats:
        """The splats as `camera` sees them, computed as the last training render computed its view's (its options
        and renderer): the screen exchange (screen_exchange.py) recomputes every rank's view with this."""
        return screen_space(self.splats(), camera, self.train_view[1], self.renderer())

    def _stored_matrices(self, camera: Cameras) -> tuple[Tensor, Tensor] | None:
        """A training camera's matrices as the datamanager stored them (camera_matrices.py): (world-to-camera [4, 4],
        full-resolution intrinsics [3, 3]), in training with the camera optimizer off; else None (built here)."""
        if not self.training or self.config.camera_optimizer.mode != "off":
            return None
        return stored_matrices(camera)

    def _get_background_color(self) -> Tensor:
        """[3] splatfacto's background; a random colour in training with random_background_in_training."""
        if self.training and self.config.random_background_in_training:
            return torch.rand(3, device=self.device)
        return super()._get_background_color()

    def sh_degree_now(self) -> int:
        """The SH degree renders use at this step (splatfacto's: one more every sh_degree_interval steps)."""
        return min(self.step // self.config.sh_degree_interval, self.config.sh_degree)

    def gradient_columns(self) -> list[int | None]:
        """For each of gauss_params, in order: how many leading values of a row of its gradient can be non-zero at
        this step (None: all of them). The SH coefficients past sh_degree_now() take no gradient (every renderer's SH
        backward leaves zeros there), so the gradient exchange leaves them out: below degree 3 a splat's row has 14
        (degree 0), 23 or 38 values that can be non-zero instead of 59."""
        rest = sh_rest_values(self.sh_degree_now()) if self.config.sh_degree > 0 else None
        return [rest if name == "features_rest" else None for name in self.gauss_params]

    def renderer(self) -> str:
        """The configured renderer, auto resolved for the splats' device."""
        return resolve_backend("auto", self.means.device) if self.config.renderer == "auto" else self.config.renderer

    def uses_fused_loss(self, batch: dict) -> bool:
        """Whether this training batch takes the fused loss path (config.fused_loss, renderer fused or auto on
        CUDA)."""
        cfg = self.config
        return (
            self.training
            and cfg.fused_loss
            and self.renderer() == "fused"
            and "mask" not in batch
            and not cfg.use_bilateral_grid
            and not cfg.output_depth_during_training
        )

    def _fused_loss_outputs(self, camera: RasterCamera, opts: RasterizeOptions, batch: dict) -> dict[str, Tensor]:
        """Render, form splatfacto's loss and the rasterizer's gradients in the fused kernel (fused_backend.py)."""
        gt = self._target(batch, opts.background)
        lam = self.config.ssim_lambda
        loss = FusedLoss(l1=1.0 - lam, ssim=lam, ssim_fn=self.ssim_term)
        fused = fused_loss_step(self.splats(), camera, opts, gt, loss, want_image=True)  # the image for the metrics
        self.info = fused.strategy_info()
        self.pruned = fused.pruned
        self._keep_screen(fused.screen)
        self.strategy.step_pre_backward(self.gauss_params, self.optimizers, self.strategy_state, self.step, self.info)
        return {"rgb": fused.rgb, "depth": None, "accumulation": fused.alpha, "background": opts.background,
                "fused_loss": fused.loss}  # fmt: skip

    def _downscale_if_required(self, image: Tensor) -> Tensor:
        """Splatfacto's downscale of the ground truth (a d x d box filter, stride d) as a reshape and a mean rather
        than cuDNN's convolution, which picks its algorithm at the first use of a shape: a CUDA graph recording
        (step_graph.py) cannot. The same values up to float rounding. [H, W, C] -> [H // d, W // d, C] float32."""
        d = self._get_downscale_factor()
        if d <= 1:
            return image
        height, width = image.shape[0] // d, image.shape[1] // d
        blocks = image[: height * d, : width * d].to(torch.float32).reshape(height, d, width, d, -1)
        return blocks.mean(dim=(1, 3))

    # Splatfacto's training metrics and loss, computed without host syncs: splatfacto's versions copy small
    # tensors from host memory every step (torchmetrics' PSNR, the SSIM window, a zero scale_reg), and each such
    # copy waits for the GPU. The SSIM term is bytesplat_ns/ssim.py's (a CUDA kernel by default).
    def _target(self, batch: dict, background: Tensor) -> Tensor:
        """The ground truth at the current resolution, composited over the background [H, W, 3] (once per batch)."""
        if "bytesplat_target" not in batch:
            image = self.get_gt_img(batch["image"])
            if self.training and self.config.random_background_in_training and image.shape[-1] != 4:
                raise ValueError(
                    "--pipeline.model.random-background-in-training True needs images with an alpha channel, but "
                    f"this training image has {image.shape[-1]} channels. Keep the alpha channel (blender scenes: "
                    "end the command with `blender-data --alpha-color None`), or drop the option."
                )
            batch["bytesplat_target"] = self.composite_with_background(image, background)
        return batch["bytesplat_target"]

    def get_metrics_dict(self, outputs, batch) -> dict[str, Tensor]:
        """Splatfacto's training metrics, plus the splats pruned on-chip this step (fused renderer), which the
        trainer logs every --logging.steps-per-log steps (the only time it is read back from the GPU)."""
        gt, pred = self._target(batch, outputs["background"]), outputs["rgb"]
        metrics = {"psnr": psnr(pred, gt), "gaussian_count": self.num_points}
        if self.config.color_corrected_metrics:
            metrics["cc_psnr"] = psnr(color_correct(pred, gt), gt)
        self.camera_optimizer.get_metrics_dict(metrics)
        if self.training and self.pruned is not None:
            metrics["pruned_tile_entries"] = self.pruned.sum()
        return metrics

    def get_loss_dict(self, outputs, batch, metrics_dict=None) -> dict[str, Tensor]:
        """Splatfacto's loss: (1 - ssim_lambda) L1 + ssim_lambda (1 - SSIM), masks, scale regularisation, camera
        optimizer and bilateral-grid terms."""
        gt, pred = self._target(batch, outputs["background"]), outputs["rgb"]
        if "mask" in batch:  # masked pixels black in both images, as splatfacto
            mask = self._downscale_if_required(batch["mask"]).to(self.device)
            gt, pred = gt * mask, pred * mask
        if "fused_loss" in outputs:  # formed in the fused kernel (uses_fused_loss)
            main_loss = outputs["fused_loss"]
        else:
            l1 = torch.abs(gt - pred).mean()
            simloss = 1 - self.ssim_term(gt, pred)
            main_loss = (1 - self.config.ssim_lambda) * l1 + self.config.ssim_lambda * simloss
        scale_reg = torch.zeros((), device=self.device)
        if self.config.use_scale_regularization and self.step % 10 == 0:
            scale_exp = torch.exp(self.scales)
            ratio = scale_exp.amax(dim=-1) / scale_exp.amin(dim=-1)
            scale_reg = 0.1 * (torch.clamp_min(ratio, self.config.max_gauss_ratio) - self.config.max_gauss_ratio).mean()
        loss_dict = {"main_loss": main_loss, "scale_reg": scale_reg}
        if self.training:
            self.camera_optimizer.get_loss_dict(loss_dict)
            if self.config.use_bilateral_grid:
                loss_dict["tv_loss"] = 10 * total_variation_loss(self.bil_grids.grids)
        return loss_dict

    def get_image_metrics_and_images(self, outputs, batch):
        gt = self.composite_with_background(self.get_gt_img(batch["image"]), outputs["background"])
        pred = outputs["rgb"]
        gt_chw, pred_chw = gt.permute(2, 0, 1)[None], pred.permute(2, 0, 1)[None]
        metrics = {"psnr": float(self.psnr(gt_chw, pred_chw).item()), "ssim": float(self.ssim(gt_chw, pred_chw))}
        if self.lpips is not None:
            metrics["lpips"] = float(self.lpips(gt_chw, pred_chw))
        return metrics, {"img": torch.cat([gt, pred], dim=1)}
