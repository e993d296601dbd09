"""Bytes each rank sends to average the splat gradients of W views, by exchange plan, on real gradient rows (#4).

Issue #4 asks to choose between an all-gather of the compacted rows and an all-to-all by measurement. Bytes are
set by which rows each view's gradient touches, so this renders views of a 2M-splat scene on one device, keeps each
view's touched rows (any non-zero gradient), groups the views W at a time (W ranks, one view each, a step) and
counts, per step, what each plan makes every rank send. NCCL's collectives move equal-sized buffers, so a plan's
buffers are padded to the step's largest (the least any sync-free version of the plan could send: it needs a
capacity at least that large; bytesplat's exchange sends its capacity, set from earlier steps' counts):
- dense: a ring all-reduce of the whole [N, 59] float32 gradient, 2 (W - 1) / W of it;
- all-gather (bytesplat's plan below --pipeline.exchange-all-to-all-from ranks, grad_compaction.py): every rank's
  touched rows (index + 59 values) to the W - 1 others;
- all-to-all (bytesplat's routed plan from that many ranks): row i belongs to rank i mod W; each rank sends each
  other rank its touched rows that rank owns (all_to_all), each owner sums what it got, then sends the sums of its
  touched-anywhere rows to the W - 1 others (all-gather; every rank needs the whole mean to keep its splats
  identical): two rounds.
Scenes: `room` (the multi_gpu.py room: cameras inside, each view sees a part) and `object` (the same splats seen
from outside, cameras on a sphere looking at the centre, as lego's views: they overlap). This measures bytes; time
on NVLink needs the two-GPU machine (multi_gpu.py). What it times is bytesplat's exchange of one view's gradients
alone on this device (a world of one rank, whose collectives copy locally), rows all-gathered or routed to owners:
the cost of each plan's packing and summing. Prints a table last, writes --json.

    python3 benchmarks/exchange_plans.py --json $OUT/exchange_plans.json        # on a GPU
    python3 benchmarks/exchange_plans.py --cpu-smoke                            # a tiny version anywhere
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from multi_gpu import ROOM_HALF, ROOM_SPLATS, camera_looking, room_camera, room_splats, view_backward  # noqa: E402

from bytesplat_ns.grad_compaction import SparseRowExchange  # noqa: E402
from bytesplat_ns.render import RasterCamera  # noqa: E402

VALUES_PER_ROW = 59  # means 3, scales 3, quats 4, features_dc 3, features_rest 45, opacities 1
ROW_BYTES = 4 + 4 * VALUES_PER_ROW  # int32 index + float32 values
WORLDS = (2, 3, 4, 8)


def object_camera(seed: int, device: torch.device, width: int, height: int) -> RasterCamera:
    """A camera outside the room's cube, 2.8 half-sides from its centre, looking at the centre (as lego's views)."""
    g = torch.Generator().manual_seed(seed)
    yaw = float(torch.rand((), generator=g)) * 2 * math.pi
    pitch = (float(torch.rand((), generator=g)) - 0.3) * 1.2
    direction = torch.tensor([math.cos(yaw) * math.cos(pitch), math.sin(yaw) * math.cos(pitch), math.sin(pitch)])
    return camera_looking(2.8 * ROOM_HALF * direction, -direction, device, width, height, fov_degrees=50)


def touched_rows(params: dict[str, torch.Tensor], camera: RasterCamera, backend: str) -> torch.Tensor:
    """-> [N] bool: the splats whose gradient the view's L1 loss makes non-zero."""
    view_backward(params, camera, backend)
    n = params["means"].shape[0]
    touched = torch.cat([p.grad.reshape(n, -1) for p in params.values()], 1).ne(0).any(1)
    for p in params.values():
        p.grad = None
    return touched


def step_bytes(masks: torch.Tensor) -> dict[str, int]:
    """Bytes each rank sends in one step, by plan, for the ranks' touched rows `masks` [W, N] bool."""
    world, n = masks.shape
    owner = torch.arange(n, device=masks.device) % world
    owned = torch.stack([owner == o for o in range(world)])  # [W, N]
    per_pair = (masks[:, None, :] & owned[None, :, :]).sum(-1)  # [W sender, W owner] touched rows
    others = ~torch.eye(world, dtype=torch.bool, device=masks.device)
    union_owned = (masks.any(0)[None, :] & owned).sum(-1)  # [W owner]
    return {
        "dense": 2 * (world - 1) * n * VALUES_PER_ROW * 4 // world,
        "all_gather": (world - 1) * int(masks.sum(1).max()) * ROW_BYTES,
        "all_to_all": (world - 1) * (int(per_pair[others].max()) + int(union_owned.max())) * ROW_BYTES,
    }


def exchange_ms(grads: list[torch.Tensor], routed: bool, runs: int = 20) -> float:
    """Median ms of one exchange of `grads` (the kernels on a GPU) by this process alone, after three that set the
    capacities; timed by CUDA events on a GPU."""
    exchange = SparseRowExchange(kernels=grads[0].is_cuda, lag=1, all_to_all_from=1 if routed else 2)
    work = [g.clone() for g in grads]
    times = []
    for _ in range(runs + 3):
        torch._foreach_copy_(work, grads)
        if grads[0].is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            exchange.average(work)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            exchange.average(work)
            times.append(1000 * (time.perf_counter() - began))
    return sorted(times[3:])[runs // 2]


def measure(scene: str, views: int, n: int, size: tuple[int, int], device: torch.device, backend: str) -> dict:
    params = room_splats(n, seed=0, device=device)
    make_camera = room_camera if scene == "room" else object_camera
    cameras = [make_camera(7919 * v + 1, device, *size) for v in range(views)]
    masks = torch.stack([touched_rows(params, camera, backend) for camera in cameras])  # [V, N]
    result = {"scene": scene, "splats": n, "image": f"{size[0]}x{size[1]}", "views": views,
              "visible_fraction_mean": float(masks.float().mean())}  # fmt: skip
    view_backward(params, cameras[0], backend)
    grads = [p.grad for p in params.values()]
    result["one_rank_exchange_ms"] = {plan: exchange_ms(grads, plan == "routed") for plan in ("all_gather", "routed")}
    for p in params.values():
        p.grad = None
    for world in WORLDS:
        steps = [step_bytes(masks[s : s + world]) for s in range(0, views - world + 1, world)]
        plans = {plan: sum(s[plan] for s in steps) / len(steps) for plan in steps[0]}
        unions = [float(masks[s : s + world].any(0).float().mean()) for s in range(0, views - world + 1, world)]
        result[f"w{world}"] = {
            "steps": len(steps),
            "bytes_per_rank": plans,
            "reduction_vs_dense": {plan: 1 - b / plans["dense"] for plan, b in plans.items() if plan != "dense"},
            "union_fraction_mean": sum(unions) / len(unions),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--views", type=int, default=64, help="views per scene (grouped 2, 3, 4 and 8 at a time)")
    parser.add_argument("--scenes", nargs="+", default=["room", "object"], choices=["room", "object"])
    parser.add_argument("--json", type=Path, default=Path("exchange_plans.json"))
    parser.add_argument("--cpu-smoke", action="store_true", help="3,000 splats at 96x54 on the CPU (torch renderer)")
    args = parser.parse_args()
    if args.cpu_smoke:
        device, backend, n, size = torch.device("cpu"), "torch", 3000, (96, 54)
    else:
        device, backend, n, size = torch.device("cuda"), "auto", ROOM_SPLATS, (1920, 1080)
    began = time.perf_counter()
    group = "nccl" if device.type == "cuda" else "gloo"  # a world of one rank, for exchange_ms
    dist.init_process_group(group, init_method=f"file:///tmp/exchange-plans-{time.time_ns()}", rank=0, world_size=1)
    results = [measure(scene, args.views, n, size, device, backend) for scene in args.scenes]
    dist.destroy_process_group()
    device_name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    record = {"device": device_name, "wall_s": time.perf_counter() - began, "scenes": results}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=2) + "\n")
    print(f"{'scene':<7} {'W':>2} {'visible':>8} {'union':>6} {'dense MiB':>10} {'all-gather':>17} {'all-to-all':>17}")
    for r in results:
        for world in WORLDS:
            w = r[f"w{world}"]
            b, less = w["bytes_per_rank"], w["reduction_vs_dense"]
            cells = [f"{b[plan] / 2**20:7.1f} ({100 * less[plan]:4.1f}%)" for plan in ("all_gather", "all_to_all")]
            print(f"{r['scene']:<7} {world:2d} {100 * r['visible_fraction_mean']:7.1f}% "
                  f"{100 * w['union_fraction_mean']:5.1f}% {b['dense'] / 2**20:10.1f} {cells[0]:>17} "
                  f"{cells[1]:>17}")  # fmt: skip
    print("(MiB each rank sends per step, mean over steps; in brackets: less than the dense all-reduce)")
    for r in results:
        ms = r["one_rank_exchange_ms"]
        print(f"{r['scene']}: one view's exchange alone on {device_name}: all-gathered {ms['all_gather']:.2f} ms, "
              f"routed {ms['routed']:.2f} ms (median of 20)")  # fmt: skip


if __name__ == "__main__":
    main()
