"""The built-in scene trained on the CPU, for the quality studies of one_step_late_cpu.py and stale_gradients_cpu.py:
the scene (128x128, 48 training / 8 held-out views, made once under a folder) and the run's bytesplat config."""

from __future__ import annotations

import copy
import os
import platform
from pathlib import Path

MACHINE = f"{os.cpu_count()} CPU cores, {platform.platform()}"
"""Where the runs ran, for the results JSON."""


def built_in_scene(root: Path) -> Path:
    """The built-in scene (DemoSceneConfig's defaults) in root/scene, generated unless it is there."""
    from bytesplat_ns.demo_scene import DemoSceneConfig, generate_demo_scene

    scene = root / "scene"
    if not (scene / "transforms.json").exists():
        generate_demo_scene(scene, DemoSceneConfig())
    return scene


def cpu_config(scene: Path, out: Path, views: int, seed: int, lr_scale: float = 1.0):
    """bytesplat's config for a CPU run of `views` views on `scene` into `out`: full resolution (as the demo trains
    it), no viewer or evaluation during training (the trainer's closing evaluation gives the held-out PSNR), every
    learning rate times `lr_scale` (on top of what several GPUs' rule sets, view_schedule.py)."""
    from bytesplat_method_configs import bytesplat
    from bytesplat_ns.view_schedule import scale_learning_rates

    config = copy.deepcopy(bytesplat.config)
    config.pipeline.datamanager.data = Path(scene)
    config.machine.device_type, config.machine.seed = "cpu", seed
    config.max_num_iterations, config.steps_per_save = views, views
    config.output_dir, config.experiment_name, config.timestamp = Path(out), "scene", "run"
    config.vis, config.steps_per_eval_all_images, config.steps_per_eval_image = "tensorboard", 0, 0
    config.pipeline.model.num_downscales = 0
    scale_learning_rates(config, lr_scale)
    return config
