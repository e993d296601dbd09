"""One step late against the exchange in its step, on the CPU (issue #4): what applying each step's averaged
gradients at the next step (--pipeline.exchange-one-step-late True, late_update.py) does to held-out PSNR.

Two gloo processes (one core each) train the built-in scene (128x128, 48 training and 8 held-out views) with the
compacted exchange, once with the gradients applied in their step and once one step late, for each seed; rank 0
evaluates the held-out views at the end (the trainer's summary evaluation). A small scene on CPUs, so an indication
of the quality cost, not the lego or room figure (those need the GPUs: benchmarks/multi_gpu.py --exchanges compact
late). Prints a table last; writes --json.

    python benchmarks/one_step_late_cpu.py --views 1000 --seeds 42 43 --json benchmarks/results/one_step_late_cpu.json

--modes picks the runs; --lr-scale multiplies every learning rate on top of two GPUs' sqrt(2) (view_schedule.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import mean

import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).parent))
from built_in_scene_cpu import MACHINE, built_in_scene, cpu_config  # noqa: E402

MODES = {"in its step": False, "one step late": True}


def _rank(rank: int, world: int, init: str, scene: str, out: str, views: int, seed: int, late: bool,
          lr_scale: float) -> None:  # fmt: skip
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        config = cpu_config(Path(scene), Path(out), views, seed, lr_scale)
        config.pipeline.exchange_one_step_late = late
        config.machine.num_devices = world  # set after construction: the config's check asks for GPUs
        trainer = config.setup(local_rank=rank, world_size=world)
        trainer.setup()
        started = time.perf_counter()
        trainer.train()
        if rank == 0:
            result = {"heldout_psnr": trainer.heldout_psnr, "splats": trainer.pipeline.model.num_points,
                      "train_s": time.perf_counter() - started}  # fmt: skip
            (Path(out) / "result.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--views", type=int, default=800, help="training views of each run (2 per step)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument(
        "--lr-scale",
        type=float,
        default=1.0,
        help="every learning rate times this, on top of two GPUs' sqrt(2) (0.7071: one GPU's rates)",
    )
    parser.add_argument("--out", type=Path, default=Path("/tmp/one-step-late-cpu"))
    parser.add_argument("--json", type=Path, default=Path("one_step_late_cpu.json"))
    args = parser.parse_args()

    scene = built_in_scene(args.out)
    runs = []
    for seed in args.seeds:
        for mode in args.modes:
            late = MODES[mode]
            out = args.out / f"s{seed}-{'late' if late else 'in-step'}-lr{args.lr_scale:g}"
            init = args.out / f"init-{time.time_ns()}"
            spawn_args = (2, str(init), str(scene), str(out), args.views, seed, late, args.lr_scale)
            mp.spawn(_rank, args=spawn_args, nprocs=2, join=True)
            result = json.loads((out / "result.json").read_text())
            runs.append({"seed": seed, "mode": mode, "lr_scale": args.lr_scale, **result})
            print(f"seed {seed}, {mode}: held-out PSNR {runs[-1]['heldout_psnr']:.2f} dB", flush=True)
    summary = {mode: mean(r["heldout_psnr"] for r in runs if r["mode"] == mode) for mode in args.modes}
    record = {
        "what": "two gloo processes on the CPU, the built-in scene (128x128, 48 training / 8 held-out views), "
        "compacted exchange: gradients applied in their step vs one step late",
        "command": f"python benchmarks/one_step_late_cpu.py --views {args.views} --seeds "
        + " ".join(map(str, args.seeds))
        + f" --modes {' '.join(args.modes)} --lr-scale {args.lr_scale:g}",
        "machine": MACHINE,
        "views": args.views,
        "runs": runs,
        "mean_heldout_psnr": summary,
    }
    if len(summary) == 2:
        record["late_minus_in_step_db"] = summary["one step late"] - summary["in its step"]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=2) + "\n")
    header = " ".join(f"{mode:>14}" for mode in args.modes)
    print(f"\n{'seed':>6} {header}   (learning rates x {args.lr_scale:g})")
    for seed in args.seeds:
        psnr = {r["mode"]: r["heldout_psnr"] for r in runs if r["seed"] == seed}
        print(f"{seed:>6} " + " ".join(f"{psnr[mode]:>14.2f}" for mode in args.modes))
    print(f"{'mean':>6} " + " ".join(f"{summary[mode]:>14.2f}" for mode in args.modes))


if __name__ == "__main__":
    main()
