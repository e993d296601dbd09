"""The rule for training with N views per step (N GPUs, one view each).

Every count in the config that nerfstudio calls "steps" is read as a count of training views: with N GPUs
one step consumes N views, so each such count is divided by N (rounded, at least 1):
- `--max-num-iterations 30000` trains on 30000 views: 30000 / N optimizer steps;
- the model's schedule (warm-up, refine interval, densification stop, screen-size stop, SH-degree and
  resolution schedules) and the learning-rate schedulers' warm-up and decay lengths;
- checkpoint and evaluation intervals.
Each step averages the gradients of N views, so every learning rate (and every scheduler's final rate) is
multiplied by sqrt(N), the square-root batch scaling that Grendel-GS and gsplat's multi-view trainer use.
Thresholds that are averages per view (densification gradient threshold, opacity culling) do not change.

A checkpoint records its N; resuming it with M GPUs continues at the same number of views seen
(step * N / M) with the learning rates and schedules of M (`rescale_resumed_optimizers`).
"""

from __future__ import annotations

import copy
import math

from nerfstudio.engine.optimizers import Optimizers
from nerfstudio.engine.trainer import TrainerConfig

TRAINER_COUNTS = ("max_num_iterations", "steps_per_save", "steps_per_eval_image", "steps_per_eval_batch",
                  "steps_per_eval_all_images", "profile_start")  # fmt: skip
MODEL_COUNTS = ("warmup_length", "refine_every", "resolution_schedule", "sh_degree_interval", "stop_split_at",
                "stop_screen_size_at")  # fmt: skip
SCHEDULER_COUNTS = ("warmup_steps", "max_steps")


def views_to_steps(count: int, views_per_step: int) -> int:
    """A count of views -> steps of `views_per_step` views (0 stays 0: "never")."""
    return 0 if count == 0 else max(1, round(count / views_per_step))


def per_step_views(config: TrainerConfig, views_per_step: int) -> TrainerConfig:
    """A copy of `config` for `views_per_step` views per step (the config itself, saved as config.yml, keeps views)."""
    if views_per_step == 1:
        return config
    config = copy.deepcopy(config)
    for name in TRAINER_COUNTS:
        setattr(config, name, views_to_steps(getattr(config, name), views_per_step))
    model = config.pipeline.model
    for name in MODEL_COUNTS:
        setattr(model, name, views_to_steps(getattr(model, name), views_per_step))
    model.views_per_step = views_per_step
    scale_learning_rates(config, math.sqrt(views_per_step))
    for group in config.optimizers.values():
        scheduler = group.get("scheduler")
        if scheduler is not None:
            for name in SCHEDULER_COUNTS:
                setattr(scheduler, name, views_to_steps(getattr(scheduler, name), views_per_step))
    return config


def scale_learning_rates(config: TrainerConfig, factor: float) -> None:
    """Multiply every optimizer's learning rate in `config`, and its scheduler's final rate, by `factor` (in place)."""
    for group in config.optimizers.values():
        group["optimizer"].lr *= factor
        scheduler = group.get("scheduler")
        if scheduler is not None and getattr(scheduler, "lr_final", None) is not None:
            scheduler.lr_final *= factor


def resumed_start_step(start_step: int, saved_views_per_step: int, views_per_step: int) -> int:
    """The step at which a run of `views_per_step` continues a checkpoint whose next step was `start_step`."""
    return start_step * saved_views_per_step // views_per_step


def rescale_resumed_optimizers(optimizers: Optimizers, config: TrainerConfig, start_step: int) -> None:
    """After loading a checkpoint written with another views-per-step: set every learning rate to what this run's
    config (already passed through `per_step_views`) gives at `start_step`."""
    for name, optimizer in optimizers.optimizers.items():
        lr_init = config.optimizers[name]["optimizer"].lr
        scheduler = optimizers.schedulers.get(name)
        for group in optimizer.param_groups:
            group["initial_lr"] = lr_init
            group["lr"] = lr_init * (scheduler.lr_lambdas[0](start_step) if scheduler is not None else 1.0)
        if scheduler is not None:
            scheduler.base_lrs = [lr_init] * len(optimizer.param_groups)
            scheduler.last_epoch = start_step
            scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
