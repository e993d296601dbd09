"""Multi-GPU bytesplat (issue #4) on the H200 x2 machine: scaling on lego (and on a generated 2M-splat room), and
exchange bytes on a 2M-splat room.

1. lego: `ns-train bytesplat` on 1 GPU and on 2 GPUs with the same number of training views (the 2-GPU run
   takes half the steps), each run alone on the machine, for each of --seeds; views per second over the
   training steps, held-out PSNR on the test split (ns-eval), bytes sent by the compacted exchange against
   a dense all-reduce (bytesplat_stats.json); means over the seeds (scaling_runs.py).
2. room exchange: 2,000,000 splats on the walls of a closed room, 2 GPUs, each rendering (gsplat, 1920x1080) a
   camera inside the room looking a random way, L1 loss, backward; then the splat gradients are averaged
   by the compacted exchange (fp32 and fp16 values) and by a dense NCCL all-reduce: bytes and time of each.
3. with --room-views: the same as 1 on the built-in generator's room at 1920x1080 with 2M splats (scaling_runs.py),
   a scene whose step is bound by the GPU and whose views each see a part of it.
--exchanges compact late screen: one 2-GPU run per seed with each exchange (grad_compaction.py, late: compact with
--pipeline.exchange-one-step-late True, late_update.py; screen_exchange.py), the summary of each in `by_exchange`.
Writes benchmarks/results/multi_gpu.json (or --json) and prints a table last. Run there:
    python benchmarks/multi_gpu.py --data .device-kit/data/lego --views 7000 --seeds 42 43 [--room-views 2000]
and more seeds in a later call with --add-to <that JSON>.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path
from statistics import median

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).parent))
from scaling_runs import (  # noqa: E402
    EXCHANGES,
    ROOM_DESCRIPTION,
    TrainScene,
    finish_run,
    lego_scene,
    print_runs,
    room_scene,
    scaling_summary,
    start_run,
    train_run,
)

from bytesplat_ns.grad_compaction import SparseRowExchange  # noqa: E402
from bytesplat_ns.render import RasterCamera, RasterizeOptions, Splats, rasterize  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOM_SPLATS = 2_000_000
ROOM_HALF = 5.0
"""The room is the cube [-5, 5]^3; splats lie on its six walls."""
ROOM_VIEWS = 12
"""Views per GPU in the room measurement."""


def probe_run(probe: str, args: argparse.Namespace) -> list[dict]:
    """One probe on lego (the room with --probe-room): GPUS[:EXCHANGE] (one run), or 1x2 (two independent 1-GPU runs
    at once, on GPUs 0 and 1: how much two busy processes slow each other's host)."""
    scene = room_scene(args.room_dir) if args.probe_room else lego_scene(args.data)
    if probe == "1x2":
        jobs = [
            start_run(
                scene,
                args.views,
                1,
                args.out,
                f"alone-on-gpu{g}",
                profile_steps=args.profile,
                extra=args.train_args,
                env={"CUDA_VISIBLE_DEVICES": str(g)},
            )  # fmt: skip
            for g in (0, 1)
        ]
        return [{"probe": f"1x2 gpu{g}", **finish_run(job, evaluate=False)} for g, job in enumerate(jobs)]
    gpus, _, exchange = probe.partition(":")
    run = train_run(scene, args.views, int(gpus), args.out, exchange or "compact", evaluate=False,
                     profile_steps=args.profile, extra=args.train_args)  # fmt: skip
    return [{"probe": probe, **run}]


def room_splats(n: int, seed: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Raw (pre-activation) splat parameters, as the model holds them, on the room's six walls."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    uv = (torch.rand(n, 2, generator=g) * 2 - 1) * ROOM_HALF
    wall = torch.randint(0, 6, (n,), generator=g)
    axis, sign = wall // 2, (wall % 2) * 2 - 1
    means = torch.empty(n, 3)
    for a in range(3):
        others = [b for b in range(3) if b != a]
        pick = axis == a
        means[pick, a] = sign[pick].float() * ROOM_HALF
        means[pick.nonzero().squeeze(1)[:, None], torch.tensor(others)] = uv[pick]
    raw = {
        "means": means,
        "scales": torch.full((n, 3), math.log(0.02)) + 0.3 * torch.randn(n, 3, generator=g),
        "quats": torch.randn(n, 4, generator=g),
        "features_dc": torch.randn(n, 3, generator=g),
        "features_rest": 0.1 * torch.randn(n, 15, 3, generator=g),
        "opacities": torch.randn(n, 1, generator=g),
    }
    return {k: v.to(device).requires_grad_() for k, v in raw.items()}


def room_camera(seed: int, device: torch.device, width: int = 1920, height: int = 1080) -> RasterCamera:
    """A camera inside the room, at a random point of its inner half, looking a random horizontal way."""
    g = torch.Generator().manual_seed(seed)
    position = (torch.rand(3, generator=g) - 0.5) * ROOM_HALF
    yaw = float(torch.rand((), generator=g)) * 2 * math.pi
    pitch = (float(torch.rand((), generator=g)) - 0.5) * 0.6
    forward = torch.tensor([math.cos(yaw) * math.cos(pitch), math.sin(yaw) * math.cos(pitch), math.sin(pitch)])
    return camera_looking(position, forward, device, width, height, fov_degrees=70)


def camera_looking(position: torch.Tensor, forward: torch.Tensor, device: torch.device, width: int, height: int,
                   fov_degrees: float) -> RasterCamera:  # fmt: skip
    """A pinhole camera at `position` [3] looking along `forward` [3] (not vertical), image x level with the world's
    xy plane, `fov_degrees` across."""
    forward = torch.nn.functional.normalize(forward, dim=0)
    right = torch.nn.functional.normalize(torch.cross(forward, torch.tensor([0.0, 0.0, 1.0]), dim=0), dim=0)
    down = torch.cross(forward, right, dim=0)
    rotation = torch.stack([right, down, forward])  # world -> camera (OpenCV axes)
    viewmat = torch.eye(4)
    viewmat[:3, :3], viewmat[:3, 3] = rotation, -rotation @ position
    focal = 0.5 * width / math.tan(math.radians(fov_degrees / 2))
    K = torch.tensor([[focal, 0, width / 2], [0, focal, height / 2], [0, 0, 1.0]])
    return RasterCamera(viewmat.to(device), K.to(device), width, height)


def view_backward(params: dict[str, torch.Tensor], camera: RasterCamera, backend: str) -> torch.Tensor:
    """Renders raw splat parameters (room_splats) from `camera` at SH degree 3 and backpropagates an L1 loss
    against grey: each parameter's .grad then holds the view's gradient. -> the render's screen radii [N] int32."""
    colors = torch.cat([params["features_dc"][:, None], params["features_rest"]], dim=1)
    splats = Splats(params["means"], params["quats"], params["scales"].exp(),
                    params["opacities"].sigmoid().squeeze(-1), colors)  # fmt: skip
    out = rasterize(splats, camera, RasterizeOptions(sh_degree=3, backend=backend))
    out.rgb.sub(0.5).abs().mean().backward()
    return out.radii.reshape(-1)


def _room_rank(rank: int, world: int, init: str, result: str, smoke: bool) -> None:
    """One GPU of the room measurement (`smoke`: a tiny CPU version over gloo, to check this script anywhere)."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    if smoke:
        device, backend, n, size = torch.device("cpu"), "torch", 3000, (96, 54)
    else:
        torch.cuda.set_device(rank)
        device, backend, n, size = torch.device("cuda", rank), "gsplat", ROOM_SPLATS, (1920, 1080)
    dist.init_process_group("gloo" if smoke else "nccl", init_method=init, rank=rank, world_size=world)
    params = room_splats(n, seed=0, device=device)
    names = list(params)
    exchanges = {"fp32": SparseRowExchange(), "fp16": SparseRowExchange(half=True)}  # capacity from earlier views
    exchanges["fp32_routed"] = SparseRowExchange(all_to_all_from=2)  # rows routed to owners, then all-gathered
    if not smoke:  # the same exchanges with the pack/unpack kernels (cuda/csrc/sparse_rows.cu)
        exchanges["fp32_kernels"] = SparseRowExchange(kernels=True)
        exchanges["fp32_kernels_routed"] = SparseRowExchange(kernels=True, all_to_all_from=2)
    rows = []
    for view in range(ROOM_VIEWS + 2):  # the first two warm up
        view_backward(params, room_camera(1000 * view + rank, device, *size), backend)
        grads = [params[n].grad for n in names]
        visible = int(torch.cat([g.reshape(n, -1) for g in grads], 1).ne(0).any(1).sum())
        row = {"visible": visible}
        for label, exchange in exchanges.items():
            trial = [g.clone() for g in grads]
            sync = torch.cuda.synchronize if not smoke else (lambda: None)
            sync()
            start = time.perf_counter()
            stats = exchange.average(trial)
            sync()
            row[f"compact_{label}_ms"] = 1000 * (time.perf_counter() - start)
            row[f"compact_{label}_bytes"] = stats.sent_bytes
            row[f"compact_{label}_overflows"] = stats.overflows
            row["dense_bytes"] = stats.dense_bytes
        flat = torch.cat([g.reshape(-1) for g in grads])
        sync()
        start = time.perf_counter()
        dist.all_reduce(flat)
        sync()
        row["dense_ms"] = 1000 * (time.perf_counter() - start)
        counts = [None] * world
        dist.all_gather_object(counts, visible)
        row["visible_all"] = counts
        rows.append(row)
        for p in params.values():
            p.grad = None
    if rank == 0:
        Path(result).write_text(json.dumps(rows[2:]))
    dist.barrier()
    dist.destroy_process_group()


def measure_room(out: Path, smoke: bool = False) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    result = out / "room.json"
    init = f"file://{out}/room-init-{time.time_ns()}"
    mp.spawn(_room_rank, args=(2, init, str(result), smoke), nprocs=2, join=True)
    rows = json.loads(result.read_text())
    dense = rows[0]["dense_bytes"]
    n = dense // (59 * 4)
    summary = {"splats": n, "image": "1920x1080", "views_per_gpu": len(rows), "dense_bytes": dense}
    labels = [k[len("compact_") : -len("_bytes")] for k in rows[0] if k.startswith("compact_") and k.endswith("_bytes")]
    for label in labels:
        sent = sum(r[f"compact_{label}_bytes"] for r in rows) / len(rows)
        summary[f"compact_{label}_bytes"] = sent
        summary[f"reduction_{label}"] = 1 - sent / dense
        summary[f"compact_{label}_ms_median"] = median(r[f"compact_{label}_ms"] for r in rows)
        summary[f"compact_{label}_overflows"] = sum(r[f"compact_{label}_overflows"] for r in rows)
    summary["dense_ms_median"] = median(r["dense_ms"] for r in rows)
    summary["visible_fraction_mean"] = sum(sum(r["visible_all"]) for r in rows) / (2 * len(rows) * n)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True, help="lego (blender-data)")
    parser.add_argument("--views", type=int, default=7000)
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench-multi-gpu"))
    parser.add_argument("--json", type=Path, default=HERE / "results" / "multi_gpu.json")
    parser.add_argument("--skip-lego", action="store_true")
    parser.add_argument("--room-views", type=int, default=0,
                        help="also train the generated 1920x1080 room (scaling_runs.py) on 1 and 2 GPUs with this many "
                             "views per run, for each of --seeds; 0: not")  # fmt: skip
    parser.add_argument("--room-dir", type=Path, default=Path("/tmp/room-scene"),
                        help="where the room is generated (once; an existing one is used)")  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=[42], help="lego: one 2-GPU and one 1-GPU run each")
    parser.add_argument("--exchanges", nargs="+", default=["compact"], choices=EXCHANGES,
                        help="the 2-GPU runs' --pipeline.exchange: one 2-GPU run per seed for each")  # fmt: skip
    parser.add_argument("--gpus", type=int, nargs="+", default=[2, 1], choices=[1, 2],
                        help="which runs each seed gets: 2 and 1 GPU (both), or one of them (with --add-to, the runs "
                             "an earlier call did not finish)")  # fmt: skip
    parser.add_argument("--add-to", type=Path, default=None,
                        help="a JSON written by an earlier call: keep its room result and training runs, add this "
                             "call's runs (more seeds), skip the room exchange measurement")  # fmt: skip
    parser.add_argument(
        "--probe",
        nargs="+",
        default=None,
        metavar="GPUS[:EXCHANGE]",
        help="only short runs without evaluation (lego; the room with --probe-room), e.g. 2:compact 2:dense 1 1x2 "
        "(writes OUT/probes.json)",
    )
    parser.add_argument("--probe-room", action="store_true",
                        help="with --probe: the probes train the generated room (--room-dir), not lego")  # fmt: skip
    parser.add_argument("--warmup-views", type=int, default=500,
                        help="lego: one 2-GPU run of this many views first, not recorded (the first run on a fresh "
                             "machine ran slower in every phase); 0: none")  # fmt: skip
    parser.add_argument("--train-args", type=shlex.split, default=[],
                        help='more ns-train arguments for every lego run, one string: "--pin-cpus False"')  # fmt: skip
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="with --probe: profile this many steps from the middle of each run")  # fmt: skip
    parser.add_argument(
        "--cpu-smoke", action="store_true", help="tiny room on the CPU (gloo), no lego: checks the script"
    )
    args = parser.parse_args()
    if args.probe:
        probes = []
        for probe in args.probe:
            probes += probe_run(probe, args)
            (args.out / "probes.json").write_text(json.dumps(probes, indent=2) + "\n")
        print(f"{'probe':<10} {'views/s':>8}  phases (host ms/step)")
        print(f"  {'profile':<8} {'':8} {'host ms':>8} {'gpu ms':>7} {'launch':>7} {'syncs':>6} {'wait ms':>8}  "
              "sync sources")  # fmt: skip
        for run in probes:
            phases = " ".join(f"{k[:4]} {v:.2f}" for k, v in run["phase_ms"].items())
            print(f"{run['probe']:<10} {run['views_per_second']:8.1f}  {phases}")
            if run.get("exchange_parts_ms"):
                print(f"  exchange: {' '.join(f'{k} {v:.3f}' for k, v in run['exchange_parts_ms'].items())}")
            for rank, prof in enumerate(run["step_profiles"]):
                print(f"  rank {rank:<3} {'':8} {prof['host_ms']:8.2f} {prof['gpu_kernel_ms']:7.2f} "
                      f"{prof['launches']:7.0f} {prof['syncs']:6.1f} {prof['sync_wait_ms']:8.2f}  "
                      f"{list(prof['sync_sources'].items())[:4]}")  # fmt: skip
        return
    earlier = json.loads(args.add_to.read_text()) if args.add_to else {}
    room = earlier["room_2m"] if earlier else measure_room(args.out, smoke=args.cpu_smoke)
    if args.cpu_smoke:
        print(json.dumps(room, indent=2))
        return
    kept = f"room exchange: kept from {args.add_to}, not measured in this call"
    print(kept if earlier else json.dumps(room, indent=2), flush=True)
    record: dict = {"gpu": f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}", "room_2m": room}

    def save() -> None:  # what is done so far, should a later run fail
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2) + "\n")

    def seed_by_seed(scene: TrainScene, views: int, runs: list[dict]):
        """Adds per seed a 2-GPU run with each of --exchanges and a 1-GPU run to `runs` (2 then 1 GPU for the first
        seed, 1 then 2 for the next, ...), yielding after each run (so a call stopped by its time limit keeps the
        runs it finished) the summary so far: the first exchange's, with several each one's in `by_exchange`; {}
        until a 1-GPU and a 2-GPU run are there."""
        two = [(2, exchange) for exchange in args.exchanges] if 2 in args.gpus else []
        one = [(1, "compact")] if 1 in args.gpus else []
        for index, seed in enumerate(args.seeds):
            for gpus, exchange in two + one if index % 2 == 0 else one + two:
                runs.append(train_run(scene, views, gpus, args.out, exchange, extra=args.train_args, seed=seed))
                one_gpu, two_gpus = any(r["gpus"] == 1 for r in runs), {r["exchange"] for r in runs if r["gpus"] == 2}
                ready = [exchange for exchange in args.exchanges if one_gpu and exchange in two_gpus]
                summary = scaling_summary(runs, ready[0]) if ready else {}
                if len(ready) > 1:
                    summary["by_exchange"] = {exchange: scaling_summary(runs, exchange) for exchange in ready}
                yield summary

    if not args.skip_lego:
        lego, runs = lego_scene(args.data), earlier.get("lego_runs", [])
        if args.warmup_views > 0:
            train_run(lego, args.warmup_views, 2, args.out / "warmup", evaluate=False, extra=args.train_args)
        for summary in seed_by_seed(lego, args.views, runs):
            if summary:
                summary["comm_bytes_reduction_lego"] = summary.pop("comm_bytes_reduction")
            record.update(summary, lego_runs=runs)
            save()
    if args.room_views > 0:
        runs = earlier.get("room_training", {}).get("runs", [])
        for summary in seed_by_seed(room_scene(args.room_dir), args.room_views, runs):
            record["room_training"] = {"scene": ROOM_DESCRIPTION, **summary, "runs": runs}
            save()
    record["comm_bytes_reduction"] = room["reduction_fp32"]
    save()
    print(f"\n{record['gpu']}")
    print(f"room 2M splats, 1920x1080, 2 GPUs: visible {100 * room['visible_fraction_mean']:.1f}% per view; "
          f"compacted fp32 {room['compact_fp32_bytes'] / 2**20:.1f} MiB ({100 * room['reduction_fp32']:.1f}% less), "
          f"fp16 {room['compact_fp16_bytes'] / 2**20:.1f} MiB ({100 * room['reduction_fp16']:.1f}% less) vs dense "
          f"{room['dense_bytes'] / 2**20:.1f} MiB; time {room['compact_fp32_ms_median']:.2f} / "
          f"{room['compact_fp16_ms_median']:.2f} vs {room['dense_ms_median']:.2f} ms; with the pack/unpack kernels "
          f"{room.get('compact_fp32_kernels_ms_median', float('nan')):.2f} ms")  # fmt: skip
    if not args.skip_lego:
        print_runs("lego", record["lego_runs"], summaries(record))
    if "room_training" in record:
        print_runs("room", record["room_training"]["runs"], summaries(record["room_training"]))


def summaries(record: dict) -> list[dict]:
    """A record's scaling summaries: one per 2-GPU exchange; none until it has a 1-GPU and a 2-GPU run."""
    return list(record.get("by_exchange", {}).values()) or ([record] if "scaling_2gpu" in record else [])


if __name__ == "__main__":
    main()
