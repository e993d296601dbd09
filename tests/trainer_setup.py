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


def cpu_config(scene: Path, out: Path, iterations: int, experiment: str):
    """bytesplat's config for a short CPU test run: no viewer, no periodic evaluation, full resolution."""
    config = copy.deepcopy(bytesplat.config)
    config.pipeline.datamanager.data = scene
    config.machine.device_type = "cpu"
    config.max_num_iterations = iterations
    config.output_dir = out
    config.experiment_name, config.timestamp = experiment, "run"
    config.vis = "tensorboard"
    config.steps_per_eval_all_images = 0
    config.steps_per_eval_image = 0
    config.nonfinite_check_every = 10
    config.pipeline.model.num_downscales = 0
    return config


def make_trainer(root: Path, steps: int, **model_options) -> ByteSplatTrainer:
    config = cpu_config(small_scene(root), root / "out", steps, "faults")
    for name, value in model_options.items():
        setattr(config.pipeline.model, name, value)
    trainer = config.setup(local_rank=0, world_size=1)
    trainer.setup()
    return trainer
