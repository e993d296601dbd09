"""Build a real ByteSplatTrainer in-process on a small built-in scene (CPU)."""

from __future__ import annotations

import copy
from pathlib import Path

from bytesplat_method_configs import bytesplat
from bytesplat_ns.demo_scene import DemoSceneConfig, generate_demo_scene
from bytesplat_ns.trainer import ByteSplatTrainer

SMALL_SCENE = DemoSceneConfig(width=32, height=24, num_train=6, num_eval=2, num_points=300, seed=7)


def small_scene(root: Path) -> Path:
    return generate_demo_scene(root / "scene", SMALL_SCENE)


def make_trainer(root: Path, steps: int, **model_options) -> ByteSplatTrainer:
    config = copy.deepcopy(bytesplat.config)
    config.pipeline.datamanager.data = small_scene(root)
    config.machine.device_type = "cpu"
    config.max_num_iterations = steps
    config.output_dir = root / "out"
    config.experiment_name, config.timestamp = "faults", "run"
    config.vis = "tensorboard"
    config.steps_per_eval_all_images = 0
    config.steps_per_eval_image = 0
    config.nonfinite_check_every = 10
    config.pipeline.model.num_downscales = 0
    for name, value in model_options.items():
        setattr(config.pipeline.model, name, value)
    trainer = config.setup(local_rank=0, world_size=1)
    trainer.setup()
    return trainer
