"""ByteSplat's method specifications: the only place that composes TrainerConfigs.

Installed as the package `bytesplat_method_configs` (see pyproject.toml), so it cannot collide with
another plugin's top-level `method_configs`. Registered through the `nerfstudio.method_configs` entry point.
"""

from __future__ import annotations

from nerfstudio.configs.base_config import ViewerConfig
from nerfstudio.engine.schedulers import ExponentialDecaySchedulerConfig
from nerfstudio.plugins.types import MethodSpecification

from bytesplat_ns import nerfstudio_patches
from bytesplat_ns.datamanager import ByteSplatDatamanagerConfig
from bytesplat_ns.dataparser import ByteSplatDataParserConfig
from bytesplat_ns.fused_adam import FusedAdamOptimizerConfig
from bytesplat_ns.model import ByteSplatModelConfig
from bytesplat_ns.pipeline import ByteSplatPipelineConfig
from bytesplat_ns.trainer import ByteSplatTrainerConfig

nerfstudio_patches.quicken_external_methods()  # nerfstudio loads this module just before it needs the change


def _adam(lr: float, decay_to: float | None = None, max_steps: int = 30000, warmup: int = 0) -> dict:
    scheduler = None
    if decay_to is not None:
        scheduler = ExponentialDecaySchedulerConfig(
            lr_final=decay_to, max_steps=max_steps, warmup_steps=warmup, lr_pre_warmup=0 if warmup else 1e-8
        )
    return {"optimizer": FusedAdamOptimizerConfig(lr=lr, eps=1e-15), "scheduler": scheduler}


def splatfacto_optimizers() -> dict:
    """Splatfacto's (nerfstudio 1.1.5) learning rates and schedules, one entry per model param group; Adam runs
    fused (bytesplat_ns/fused_adam.py; `--optimizers.<group>.optimizer.fused False` for torch's default)."""
    return {
        "means": _adam(1.6e-4, decay_to=1.6e-6),
        "features_dc": _adam(0.0025),
        "features_rest": _adam(0.0025 / 20),
        "opacities": _adam(0.05),
        "scales": _adam(0.005),
        "quats": _adam(0.001),
        "camera_opt": _adam(1e-4, decay_to=5e-7, warmup=1000),
        "bilateral_grid": _adam(2e-3, decay_to=1e-4, warmup=1000),
    }


bytesplat = MethodSpecification(
    config=ByteSplatTrainerConfig(
        method_name="bytesplat",
        steps_per_eval_image=100,
        steps_per_eval_batch=0,
        steps_per_save=2000,
        steps_per_eval_all_images=1000,
        max_num_iterations=30000,
        mixed_precision=False,
        pipeline=ByteSplatPipelineConfig(
            datamanager=ByteSplatDatamanagerConfig(
                dataparser=ByteSplatDataParserConfig(),  # nerfstudio-data; its PLY read without open3d
                cache_images_type="uint8",
            ),
            model=ByteSplatModelConfig(),
        ),
        optimizers=splatfacto_optimizers(),
        viewer=ViewerConfig(num_rays_per_chunk=1 << 15),
        vis="viewer",
    ),
    description=(
        "ByteSplat Gaussian Splatting: splatfacto's recipe on fused CUDA kernels (renderers fused, gsplat, torch), "
        "one GPU or many (--machine.num-devices N)."
    ),
)
