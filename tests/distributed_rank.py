"""One rank of a gloo (CPU) multi-process bytesplat training, as nerfstudio's launcher would run it on GPUs.

nerfstudio's launcher asserts CUDA before it starts several processes, so the CPU tests start the ranks
themselves: `python -m tests.distributed_rank RANK WORLD INIT_FILE ROOT [--signal-at STEP SIGNAL] [--steps N]
[--load-dir DIR] [--cuda] [--half-exchange] [--route-from N] [--exchange KIND] [--shuffled-draws]
[--one-step-late] [--peer-reads] [--alone-as-rank-0-of-2]`. Each rank trains the small built-in scene and writes
ROOT/rank{RANK}.pt: its splat count after every step, the training camera it drew at every step, its final
parameters and its step graph's counts (one step late: whether rows were pending after each step).
--cuda: NCCL, GPU RANK, a white background (the default CUDA path: fused renderer, step graph).
--half-exchange: float16 values in the gradient exchange. The test scene's few hundred splats are mostly in every
view, so with float32 values the compacted rows would outweigh a dense all-reduce and every exchange is that
all-reduce (grad_compaction.py); float16 rows are half as large, so the exchange compacts.
--route-from N: route the exchange's rows to owner ranks from N ranks on (--pipeline.exchange-all-to-all-from).
--exchange KIND: --pipeline.exchange (compact by default; screen: screen_exchange.py).
--shuffled-draws: each rank shuffles its shard alone (--pipeline.datamanager.match-view-costs False; matched draws,
the default, otherwise: datamanager.py).
--one-step-late: each step's averaged gradients applied at the next (--pipeline.exchange-one-step-late True).
--peer-reads: each rank reads the others' rows from their memory (--pipeline.exchange-peer-reads True; GPUs).
--alone-as-rank-0-of-2: WORLD must be 1; the trainer is set up as rank 0 of two (two views' schedule, half the
cameras, the exchange) in a process group of this process alone, as benchmarks/lone_rank.py runs it: what a
rank's own step does with several GPUs, on one GPU.
"""

from __future__ import annotations

import argparse
import functools
import os
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from nerfstudio.engine.callbacks import TrainingCallback, TrainingCallbackLocation

from bytesplat_ns import trainer as trainer_module
from bytesplat_ns.demo_scene import DemoSceneConfig, generate_demo_scene
from bytesplat_ns.rank_watchdog import RankWatchdog
from tests.trainer_setup import cpu_config

PAUSE_S = 4.0
SCENE = DemoSceneConfig(width=32, height=24, num_train=7, num_eval=2, num_points=300, seed=11)


def scene_path(root: Path) -> Path:
    """The test scene (written once by the test, before the ranks start)."""
    path = root / "scene"
    if not (path / "transforms.json").exists():
        generate_demo_scene(path, SCENE)
    return path


def rank_config(root: Path, views: int, load_dir: Path | None = None):
    """The bytesplat config of the test run; counts are in views (the trainer converts them to steps)."""
    config = cpu_config(scene_path(root), root / "out", views, "dist")
    config.steps_per_save = views
    config.summary_eval = False
    config.load_dir = load_dir
    model = config.pipeline.model
    model.warmup_length = 8
    model.refine_every = 8
    model.reset_alpha_every = 4
    model.sh_degree_interval = 16
    model.stop_split_at = views
    model.densify_grad_thresh = 1e-5  # a tiny scene: make sure refines duplicate and split
    return config


def run_rank(rank: int, world: int, init_file: str, root: Path, views: int, signal_at: tuple[int, int] | None = None,
             load_dir: Path | None = None, pause_at: int | None = None, cuda: bool = False,
             half_exchange: bool = False, route_from: int | None = None,
             exchange: str = "compact", shuffled_draws: bool = False,
             one_step_late: bool = False, alone_as_rank_0_of_2: bool = False,
             peer_reads: bool = False) -> None:  # fmt: skip
    """`signal_at` = (step, signal): this rank sends itself the signal after that step (SIGKILL: dies; SIGSTOP: hangs;
    SIGINT: asks to stop). `pause_at`: rank 0 pauses there as the viewer's pause button does, resuming PAUSE_S after
    the ranks agreed to pause."""
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    config = rank_config(root, views, load_dir)
    config.machine.num_devices = world
    config.pipeline.half_precision_exchange = half_exchange
    config.pipeline.exchange = exchange
    config.pipeline.datamanager.match_view_costs = not shuffled_draws
    config.pipeline.exchange_one_step_late = one_step_late
    config.pipeline.exchange_peer_reads = peer_reads
    if route_from is not None:
        config.pipeline.exchange_all_to_all_from = route_from
    if cuda:
        config.machine.device_type = "cuda"
        config.pipeline.model.background_color = "white"
        config.pipeline.model.stop_split_at = views // 2  # then steady steps: the step graph replays
        config.cuda_graph_several_gpus = True
    if alone_as_rank_0_of_2:
        assert world == 1, "--alone-as-rank-0-of-2 runs one process"
        trainer_module.RankWatchdog = functools.partial(RankWatchdog, silent_after_s=float("inf"))  # no rank 1
        world = 2
    trainer = config.setup(local_rank=rank, world_size=world)
    trainer.setup()
    counts: list[int] = []
    times: list[float] = []
    resumes: list[int] = []  # the run control's resume count after each step: when the ranks paused
    resume: list[threading.Timer] = []  # rank 0's, started once the ranks agreed to pause
    model = trainer.pipeline.model
    model.strategy.verbose = False
    drawn: list[int] = []
    pending: list[tuple[bool, bool]] = []  # one step late: (rows pending after the step, the step edited the splats)
    datamanager = trainer.pipeline.datamanager
    next_train = datamanager.next_train

    def drawing(step: int):
        camera, batch = next_train(step)
        drawn.append(camera.metadata["cam_idx"])
        return camera, batch

    datamanager.next_train = drawing

    def after_step(step: int) -> None:  # runs after the model's own densification callback
        counts.append(model.num_points)
        times.append(time.monotonic())
        resumes.append(trainer.control.resumes if trainer.control else 0)
        if trainer.late is not None:
            pending.append((trainer.late.pending, model.strategy.edits_splats_at(step)))
        if rank == 0 and step == pause_at:
            trainer.training_state = "paused"  # what the viewer's pause button does
        if rank == 0 and pause_at is not None and not resume and trainer.control.agreed_state == "paused":
            # the ranks agreed to pause at the next step: rank 0 resumes PAUSE_S from now (however long the steps
            # until the agreement took, which a GPU's first recordings make long)
            resume.append(threading.Timer(PAUSE_S, lambda: setattr(trainer, "training_state", "training")))
            resume[0].start()
        if signal_at is not None and step == signal_at[0]:
            os.kill(os.getpid(), signal_at[1])

    trainer.callbacks.append(TrainingCallback([TrainingCallbackLocation.AFTER_TRAIN_ITERATION], after_step))
    trainer.train()
    params = {name: p.detach().cpu() for name, p in model.gauss_params.items()}
    record = {
        "counts": counts,
        "drawn": drawn,
        "pending": pending,
        "times": times,
        "resumes": resumes,
        "params": params,
        "start_step": trainer._start_step,
        "step": trainer.step,
        "graph": (trainer.step_graph.captures, trainer.step_graph.replays) if trainer.step_graph else None,
        "graph_off": trainer.graph_off,
    }
    torch.save(record, root / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("rank", type=int)
    parser.add_argument("world", type=int)
    parser.add_argument("init_file")
    parser.add_argument("root", type=Path)
    parser.add_argument("--views", type=int, default=48)
    parser.add_argument("--signal-at", type=int, nargs=2, default=None, metavar=("STEP", "SIGNAL"))
    parser.add_argument("--load-dir", type=Path, default=None)
    parser.add_argument("--pause-at", type=int, default=None)
    parser.add_argument("--cuda", action="store_true")
    parser.add_argument("--half-exchange", action="store_true")
    parser.add_argument("--route-from", type=int, default=None)
    parser.add_argument("--exchange", default="compact")
    parser.add_argument("--shuffled-draws", action="store_true")
    parser.add_argument("--one-step-late", action="store_true")
    parser.add_argument("--alone-as-rank-0-of-2", action="store_true")
    parser.add_argument("--peer-reads", action="store_true")
    args = parser.parse_args()
    signal_at = tuple(args.signal_at) if args.signal_at else None
    run_rank(args.rank, args.world, args.init_file, args.root, args.views, signal_at, args.load_dir, args.pause_at,
             args.cuda, args.half_exchange, args.route_from, args.exchange, args.shuffled_draws,
             args.one_step_late, args.alone_as_rank_0_of_2, args.peer_reads)  # fmt: skip


if __name__ == "__main__":
    main()
