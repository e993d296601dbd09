"""How long each training view's step takes on the GPU, and so how long two ranks wait for each other (issue #4).

With N GPUs every rank renders its own view and the step ends at the exchange, so a step lasts as long as its
slowest rank's view: with views of unequal cost the ranks wait. This times, on one GPU, each training view of a
trained run on the generated room (scaling_runs.py: 2M splats, 1920x1080, seen from inside): the training step's
GPU work (render with the fused loss path against the view's image, backward to the parameters), recorded as a CUDA
graph per view (tile binning at a fixed capacity, as training runs it) and replayed; the median of `--runs`
replays (CUDA events). Then the mean over views, and over every ordered pair of distinct views the mean of the
slower one's time: what a step of two ranks would take before its exchange.
Then what the datamanager's draws would make two ranks wait, from those times (`draw_waits`, no GPU needed): the
views split into two shards as datamanager.py splits cameras (seeds 0-19), each rank drawing its shard in a
shuffled order (the default) or the same cost quantile of its shard at each step (matched draws, ranked by each
view's tile entries), the mean over an epoch's steps of the slower view.
Prints a table last, writes --json.

    python3 benchmarks/view_balance.py --train-room 2000 --json $OUT/view_balance.json
    python3 benchmarks/view_balance.py --analyse benchmarks/results/view_balance.json  # the draws alone, anywhere
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from itertools import permutations
from pathlib import Path
from statistics import mean, median, pstdev

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))
from exchange_cost import trained_splats, training_cameras  # noqa: E402
from scaling_runs import add_room_options, train_room  # noqa: E402
from screen_exchange_cost import fixed_bins, graph_us, splats_of  # noqa: E402

from bytesplat_ns.datamanager import camera_shard, epoch_order, matched_epoch_order  # noqa: E402
from bytesplat_ns.render import RasterCamera, RasterizeOptions  # noqa: E402
from bytesplat_ns.render.fused_backend import FusedLoss, fused_loss_step  # noqa: E402
from bytesplat_ns.ssim import SSIMTerm  # noqa: E402

LOSS = FusedLoss(ssim_fn=SSIMTerm())
"""Splatfacto's loss as training forms it (0.8 L1 + 0.2 D-SSIM, the SSIM term by bytesplat's kernel)."""


def training_images(data: Path, count: int, device: torch.device) -> list[torch.Tensor]:
    """The first `count` training images of `data` (nerfstudio-data), [H, W, 3] float32 in [0, 1]."""
    meta = json.loads((data / "transforms.json").read_text())
    images = []
    for path in meta["train_filenames"][:count]:
        rgb = np.asarray(Image.open(data / path).convert("RGB"), dtype=np.float32) / 255.0
        images.append(torch.from_numpy(rgb).to(device))
    return images


def view_step(params: dict[str, torch.Tensor], camera: RasterCamera, image: torch.Tensor, runs: int) -> dict:
    """One view's training step (fused loss path, backward to the parameters) replayed from a CUDA graph."""
    seen = {}

    def probe(opts: RasterizeOptions) -> None:  # the exact binning's render: the share of splats in view
        seen["in_view"] = float(
            (fused_loss_step(splats_of(params), camera, opts, image, LOSS).radii > 0).float().mean()
        )

    opts, entries = fixed_bins(probe)
    ms = graph_us(lambda: fused_loss_step(splats_of(params), camera, opts, image, LOSS).loss.backward(), runs) / 1000
    for p in params.values():
        p.grad = None
    return {"ms": ms, "in_view_fraction": seen["in_view"], "tile_entries": entries}


def draw_waits(views: list[dict], seeds: range = range(20)) -> dict:
    """Mean over `seeds` of the mean slower-of-two-ranks view time (ms) per step of an epoch: shuffled draws and
    matched draws (datamanager.py), the views' measured times and tile entries standing in for their costs."""
    times = [v["ms"] for v in views]
    costs = {c: float(v["tile_entries"]) for c, v in enumerate(views)}
    waits: dict[str, list[float]] = {"shuffled": [], "matched": []}
    for seed in seeds:
        shards = [camera_shard(len(views), 2, rank, seed) for rank in range(2)]
        length = -(-len(views) // 2)
        orders = {
            "shuffled": [epoch_order(shard, seed, 1) for shard in shards],
            "matched": [matched_epoch_order(shard, costs, length, seed, 1) for shard in shards],
        }
        for name, (first, second) in orders.items():
            steps = min(len(first), len(second))
            waits[name].append(mean(max(times[a], times[b]) for a, b in zip(first[:steps], second[:steps])))
    return {name: mean(values) for name, values in waits.items()} | {"mean_view_ms": mean(times)}


def print_draws(draws: dict) -> None:
    view = draws["mean_view_ms"]
    print(f"two ranks, the slower view of a step: shuffled draws {draws['shuffled']:.3f} ms "
          f"(+{100 * (draws['shuffled'] / view - 1):.1f}%), matched draws {draws['matched']:.3f} ms "
          f"(+{100 * (draws['matched'] / view - 1):.1f}%) against a view's {view:.3f} ms (20 splits)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", type=Path, default=None, help="a bytesplat run folder on the generated room")
    add_room_options(parser)
    parser.add_argument("--views", type=int, default=24, help="training views to time (the room has 24)")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", type=Path, default=Path("view_balance.json"))
    parser.add_argument("--analyse", type=Path, default=None, metavar="JSON",
                        help="only the draws' waits from an earlier run's JSON (no GPU)")  # fmt: skip
    args = parser.parse_args()
    if args.analyse:
        print_draws(draw_waits(json.loads(args.analyse.read_text())["views"]))
        return
    device = torch.device("cuda")
    began = time.perf_counter()
    if args.train_room:
        args.run = train_room(args.room_data, args.train_room)
    params = trained_splats(args.run, device)
    cameras = training_cameras(args.run, args.room_data, args.views, device)
    images = training_images(args.room_data, args.views, device)
    views = [view_step(params, cam, image, args.runs) for cam, image in zip(cameras, images)]
    times = [v["ms"] for v in views]
    slower_of_two = mean(max(times[i], times[j]) for i, j in permutations(range(len(times)), 2))
    record = {
        "device": torch.cuda.get_device_name(0),
        "run": str(args.run),
        "splats": int(params["means"].shape[0]),
        "wall_s": time.perf_counter() - began,
        "mean_ms": mean(times),
        "median_ms": median(times),
        "std_ms": pstdev(times),
        "min_ms": min(times),
        "max_ms": max(times),
        "slower_of_two_ms": slower_of_two,
        "wait_fraction": slower_of_two / mean(times) - 1,
        "draws": draw_waits(views),
        "views": views,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=2) + "\n")
    print(f"{'view':>4} {'ms':>7} {'in view':>8} {'entries':>10}")
    for index, v in enumerate(views):
        print(f"{index:4d} {v['ms']:7.3f} {100 * v['in_view_fraction']:7.1f}% {v['tile_entries']:10,}")
    print(f"{record['splats']:,} splats on {record['device']}: a view's step {record['mean_ms']:.3f} ms on average "
          f"({record['min_ms']:.3f}-{record['max_ms']:.3f}, std {record['std_ms']:.3f}); the slower of two distinct "
          f"views {slower_of_two:.3f} ms: two ranks would wait {100 * record['wait_fraction']:.1f}% of a step "
          f"(GPU work of the step replayed from a CUDA graph, median of {args.runs})")  # fmt: skip
    print_draws(record["draws"])


if __name__ == "__main__":
    main()
