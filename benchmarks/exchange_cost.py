"""Where the compacted exchange's device time goes, on one GPU (issue #4).

With several GPUs and `--cuda-graph-several-gpus True` each rank's step graph holds the exchange's device part
(pack kernel, NCCL all-gather, unpack kernel; grad_compaction.py), so what it adds to a step is device time. This
measures it on one GPU, where the world is one rank: what is left is the packing every rank does whatever the
links (with one or two ranks a rank keeps its own rows in place and unpacks the others' alone, so one rank unpacks
nothing; two ranks add the unpack of the other's rows, `unp own` below). For one view's gradients of three
scenes:
- `room` and `object` (exchange_plans.py: 2M splats at 1920x1080, seen from inside, about 6% of the rows touched,
  and from outside, about 40%) and `object_50k` (50,000 splats at 800x800: lego's splat count after 7000 steps);
  with `--trained-room RUN`, also `room_trained`: the splats of a `ns-train bytesplat` run on the generated room
  (scaling_runs.py), seen from its training cameras (the first `--trained-views`; medians over them);
  `--train-room VIEWS` generates the room into `--room-data` and trains that run first (one GPU, seed 43);
- the exchange's device part recorded as a CUDA graph and replayed, median of `--runs` replays (CUDA events): rows
  all-gathered (bytesplat's plan below 4 GPUs), also told which splats the view culled (the render's radii, as
  training tells it: the pack skips their rows unread), that also at SH degrees 0, 1 and 2 (the SH coefficients
  past the degree hold zeros and are neither sent nor written: 14, 23 and 38 of a row's 59 values), and routed to
  owners (from 4);
- the pack kernel alone: with nothing held back from earlier steps (the steady state: the residual is not read),
  that and told the view, and with a row held back (after a step whose rows overflowed the capacity: the residual
  is read and rewritten, which every pack did before the held rows were counted); and as peers reading the rows
  run it (every row fits; told the view; a rank's share kept in place), at every value and at SH degree 1: the
  touched rows in tiles against every row in view sent whole (`send_in_view`); the unpack call alone, zeroing
  the gradients then adding the rows, adding them into gradients a `clear` pack left zero (as the exchange did
  with three ranks), and adding them to gradients holding a rank's own rows (as the other rank's are with two);
- for scale: a device copy of the [N, 59] gradients (one read and one write of them);
- the exchange's kernels by name (torch profiler over op-by-op exchanges), microseconds per exchange.
Prints a table last, writes --json.

    python3 benchmarks/exchange_cost.py --json $OUT/exchange_cost.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import median

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from exchange_plans import object_camera  # noqa: E402
from fused_kernel import median_ms  # noqa: E402
from multi_gpu import ROOM_SPLATS, room_camera, room_splats, view_backward  # noqa: E402
from scaling_runs import add_room_options, train_room  # noqa: E402

from bytesplat_ns.camera_matrices import viewmat_from_camera_to_world  # noqa: E402
from bytesplat_ns.cuda import ops  # noqa: E402
from bytesplat_ns.grad_compaction import SparseRowExchange, leading_values  # noqa: E402
from bytesplat_ns.model import sh_rest_values  # noqa: E402
from bytesplat_ns.render import RasterCamera  # noqa: E402

SCENES = {  # name: (splats, camera, image size)
    "room": (ROOM_SPLATS, room_camera, (1920, 1080)),
    "object": (ROOM_SPLATS, object_camera, (1920, 1080)),
    "object_50k": (50_000, object_camera, (800, 800)),
}


def median_us(fn, runs: int, before=None) -> float:
    """Median microseconds of `fn` on the device (fused_kernel.py's CUDA-event timer), `before` run untimed ahead
    of each call."""
    if before is None:
        return 1000 * median_ms(fn, iters=runs)
    return 1000 * median_ms(lambda _: fn(), iters=runs, setup=before)


def settled(grads: list[torch.Tensor], routed: bool,
            columns: list | None = None) -> tuple[SparseRowExchange, list[torch.Tensor]]:  # fmt: skip
    """An exchange whose capacities have adapted to `grads` (a few op-by-op exchanges), and gradients of its own."""
    exchange = SparseRowExchange(kernels=True, lag=1, all_to_all_from=1 if routed else 2)
    work = [g.clone() for g in grads]
    for _ in range(4):
        torch._foreach_copy_(work, grads)
        exchange.average(work, columns=columns)
    return exchange, work


def sh_degree_columns(grads: list[torch.Tensor], degree: int) -> tuple[list[torch.Tensor], list[int | None]]:
    """`grads` as a render at SH `degree` leaves them (the SH coefficients past it zero), and the values of each row
    in use (ByteSplatModel.gradient_columns); the SH coefficients' gradient is the one [N, 15, 3]."""
    columns = [sh_rest_values(degree) if g.dim() == 3 else None for g in grads]
    cut = [g.clone() for g in grads]
    for g, c in zip(cut, columns):
        if c is not None:
            g.view(g.shape[0], -1)[:, c:] = 0
    return cut, columns


def at_sh_degree(grads: list[torch.Tensor], degree: int, runs: int, visible: torch.Tensor) -> float:
    """replayed_us, rows all-gathered and told the view, of `grads` as a render at SH `degree` leaves them."""
    cut, columns = sh_degree_columns(grads, degree)
    return replayed_us(cut, False, runs, visible, columns)


def replayed_us(grads: list[torch.Tensor], routed: bool, runs: int, visible: torch.Tensor | None = None,
                columns: list | None = None) -> float:  # fmt: skip
    """The exchange's device part recorded as a CUDA graph, as the step graph holds it (told the view's radii
    `visible`, or not; `columns`: the values in use of each gradient's rows); median replay time."""
    exchange, work = settled(grads, routed, columns)
    exchange.begin(work, 0, columns)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        exchange.exchange_rows(work, visible=visible)
    exchange.end()
    return median_us(graph.replay, runs, before=lambda: torch._foreach_copy_(work, grads))


def kernels_us(grads: list[torch.Tensor], runs: int = 10) -> dict[str, float]:
    """Device microseconds per op-by-op exchange (rows all-gathered), by kernel name."""
    exchange, work = settled(grads, routed=False)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            exchange.average(work)
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    times = {e.key: e.device_time_total / runs for e in prof.key_averages() if e.device_type == cuda}
    return dict(sorted(times.items(), key=lambda kv: -kv[1]))


def pack_us(grads: list[torch.Tensor], runs: int, visible: torch.Tensor) -> dict[str, float]:
    """The pack kernel alone at the settled capacity: the residual holding no rows (the steady state: not read), that
    told the view's radii, and holding one (read, every row rewritten: what every pack did before the kernel counted
    the rows held)."""
    exchange, _ = settled(grads, routed=False)
    n, width = grads[0].shape[0], sum(g[0].numel() for g in grads)
    residual = torch.zeros(n, width, device=grads[0].device)
    held_rows = torch.zeros(1, dtype=torch.int32, device=residual.device)
    capacity = exchange.capacity
    steady = median_us(lambda: ops.pack_rows(grads, capacity, 0, False, residual, held_rows), runs)
    in_view = median_us(lambda: ops.pack_rows(grads, capacity, 0, False, residual, held_rows, visible=visible), runs)
    one_row = torch.zeros_like(residual)
    one_row[0] = 1e-3

    def hold_one_row() -> None:
        residual.copy_(one_row)
        held_rows.fill_(1)

    holding = median_us(lambda: ops.pack_rows(grads, capacity, 0, False, residual, held_rows), runs, hold_one_row)
    sh1, columns = sh_degree_columns(grads, 1)
    return {"capacity": capacity, "nothing_held_us": steady, "in_view_us": in_view, "one_row_held_us": holding,
            **peer_pack_us(grads, runs, visible), **peer_pack_us(sh1, runs, visible, columns, "_sh1")}  # fmt: skip


def peer_pack_us(grads: list[torch.Tensor], runs: int, visible: torch.Tensor, columns: list | None = None,
                 suffix: str = "") -> dict[str, float]:  # fmt: skip
    """The pack as peers reading the rows run it (every row fits, no residual; two ranks: this rank's share of the
    mean kept in place), told the view, of the values in use (`columns`): the touched rows in tiles, and every row
    in view sent whole (`send_in_view`, which peer reads use)."""
    work = [g.clone() for g in grads]
    values = leading_values(work, columns)  # [N, c] each

    def pack(whole: bool) -> None:
        ops.pack_rows(values, len(work[0]), 0, False, visible=visible, clear=True, own_scale=0.5, send_in_view=whole)

    def restore() -> None:  # the pack left this rank's share in them
        torch._foreach_copy_(work, grads)

    return {f"peer_tiles{suffix}_us": median_us(lambda: pack(False), runs, restore),
            f"peer_in_view{suffix}_us": median_us(lambda: pack(True), runs, restore)}  # fmt: skip


def unpack_us(grads: list[torch.Tensor], runs: int) -> dict[str, float]:
    """The unpack call alone, one rank's rows (every touched row in one buffer): zeroing the gradients first, into
    gradients that are zeros already (after a `clear` pack), and added to gradients holding the same rows (a
    second rank's buffer, a copy of the first, unpacked onto the first's rows kept in place: what each of two ranks
    does)."""
    rows = grads[0].shape[0]
    buffer = ops.pack_rows(grads, rows, 0, False)
    out = [torch.empty_like(g) for g in grads]
    zeroing = median_us(lambda: ops.unpack_rows(out, buffer, rows, 1.0), runs)
    into_zeros = median_us(lambda: ops.unpack_rows(out, buffer, rows, 1.0, zeroed=True), runs,
                           lambda: torch._foreach_zero_(out))  # fmt: skip
    two = torch.cat([buffer, buffer])  # [2, rows + 1, 1 + D]
    onto_own = median_us(lambda: ops.unpack_rows(out, two, rows, 0.5, own_rank=0), runs)
    return {"zeroing_us": zeroing, "into_zeros_us": into_zeros, "onto_own_rows_us": onto_own}


def trained_splats(run: Path, device: torch.device) -> dict[str, torch.Tensor]:
    """The raw splat parameters of a bytesplat run's last checkpoint (as room_splats makes them)."""
    checkpoint = sorted((run / "nerfstudio_models").glob("step-*.ckpt"))[-1]
    state = torch.load(checkpoint, map_location=device, weights_only=False)["pipeline"]
    prefix = "_model.gauss_params."
    return {k[len(prefix) :]: v.float().requires_grad_() for k, v in state.items() if k.startswith(prefix)}


def training_cameras(run: Path, data: Path, count: int, device: torch.device) -> list[RasterCamera]:
    """The first `count` training cameras of `data` (nerfstudio-data transforms.json, OpenGL axes) in the run's frame
    (dataparser_transforms.json: nerfstudio's orientation and scale)."""
    meta = json.loads((data / "transforms.json").read_text())
    frame = json.loads((run / "dataparser_transforms.json").read_text())
    transform, scale = torch.tensor(frame["transform"], dtype=torch.float64), frame["scale"]  # [3, 4]
    K = torch.tensor([[meta["fl_x"], 0, meta["cx"]], [0, meta["fl_y"], meta["cy"]], [0, 0, 1.0]])
    by_path = {f["file_path"]: f["transform_matrix"] for f in meta["frames"]}
    cameras = []
    for path in meta["train_filenames"][:count]:
        c2w = transform @ torch.tensor(by_path[path], dtype=torch.float64)  # [3, 4]
        c2w[:, 3] *= scale
        viewmat = viewmat_from_camera_to_world(c2w).float()
        cameras.append(RasterCamera(viewmat.to(device), K.to(device), meta["w"], meta["h"]))
    return cameras


def view_gradients(params: dict[str, torch.Tensor], camera: RasterCamera) -> tuple[list[torch.Tensor], torch.Tensor]:
    """-> (one view's gradients of each parameter, the render's screen radii [N] int32)."""
    radii = view_backward(params, camera, "auto")
    grads = [p.grad.detach().clone() for p in params.values()]
    for p in params.values():
        p.grad = None
    return grads, radii


def measure_trained(run: Path, data: Path, views: int, runs: int, device: torch.device) -> dict:
    """`measure` for each of the run's first training views; medians over the views, and each view's figures."""
    params = trained_splats(run, device)
    cameras = training_cameras(run, data, views, device)
    per_view = [measure_grads(*view_gradients(params, cam), (cam.width, cam.height), runs) for cam in cameras]
    summary = {
        "run": str(run),
        "views": len(per_view),
        **{key: median(v[key] for v in per_view) for key in ("touched_fraction", "in_view_fraction")},
        **{
            key: {k: median(v[key][k] for v in per_view) for k in per_view[0][key]}
            for key in ("exchange_replayed_us", "pack", "unpack_us")
        },
        "per_view": per_view,
    }
    return {**per_view[0], **summary}


def measure(scene: str, runs: int, device: torch.device) -> dict:
    n, make_camera, size = SCENES[scene]
    params = room_splats(n, seed=0, device=device)
    return measure_grads(*view_gradients(params, make_camera(1, device, *size)), size, runs)


def measure_grads(grads: list[torch.Tensor], visible: torch.Tensor, size: tuple[int, int], runs: int) -> dict:
    """The exchange's cost on one view's gradients `grads` (the splat parameters', [N, ...] each), whose render gave
    the screen radii `visible` [N]."""
    n = grads[0].shape[0]
    flat = torch.cat([g.reshape(n, -1) for g in grads], 1)  # [N, 59]
    copy = torch.empty_like(flat)
    return {
        "splats": n,
        "image": f"{size[0]}x{size[1]}",
        "touched_fraction": float(flat.ne(0).any(1).float().mean()),
        "in_view_fraction": float(visible.ne(0).float().mean()),
        "gradient_mib": flat.numel() * 4 / 2**20,
        "exchange_replayed_us": {
            "all_gather": replayed_us(grads, False, runs),
            "all_gather_told_view": replayed_us(grads, False, runs, visible),
            **{f"all_gather_told_view_sh{d}": at_sh_degree(grads, d, runs, visible) for d in range(3)},
            "routed": replayed_us(grads, True, runs),
        },
        "pack": pack_us(grads, runs, visible),
        "unpack_us": unpack_us(grads, runs),
        "copy_of_gradients_us": median_us(lambda: copy.copy_(flat), runs),
        "kernels_us_per_exchange": kernels_us(grads),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenes", nargs="+", default=list(SCENES), choices=list(SCENES))
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--json", type=Path, default=Path("exchange_cost.json"))
    parser.add_argument("--trained-room", type=Path, default=None, metavar="RUN",
                        help="a bytesplat run folder on the generated room (config.yml's folder)")  # fmt: skip
    parser.add_argument("--trained-views", type=int, default=8)
    add_room_options(parser)
    args = parser.parse_args()
    device = torch.device("cuda")
    began = time.perf_counter()
    if args.train_room:
        args.trained_room = train_room(args.room_data, args.train_room)
    dist.init_process_group("nccl", init_method=f"file:///tmp/exchange-cost-{time.time_ns()}", rank=0, world_size=1)
    results = {scene: measure(scene, args.runs, device) for scene in args.scenes}
    if args.trained_room:
        trained = measure_trained(args.trained_room, args.room_data, args.trained_views, args.runs, device)
        results["room_trained"] = trained
    dist.destroy_process_group()
    record = {"device": torch.cuda.get_device_name(0), "wall_s": time.perf_counter() - began, "scenes": results}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=2) + "\n")
    for scene, r in results.items():
        top = ", ".join(f"{k[:40]} {v:.0f}" for k, v in list(r["kernels_us_per_exchange"].items())[:4])
        print(f"{scene}: kernels per exchange (us): {top}")
    print(f"{'scene':<12} {'touched':>8} {'in view':>8} {'MiB':>5} {'graph ag':>9} {'ag view':>8} {'sh0':>6} "
          f"{'sh1':>6} {'sh2':>6} {'routed':>7} {'pack':>6} {'pk view':>8} {'pk held':>8} {'unpack':>7} "
          f"{'unp 0s':>7} {'unp own':>8} {'copy':>6} {'pk tiles':>9} {'pk whole':>9}")  # fmt: skip
    for scene, r in results.items():
        ex, pack, unpack = r["exchange_replayed_us"], r["pack"], r["unpack_us"]
        print(f"{scene:<12} {100 * r['touched_fraction']:7.1f}% {100 * r['in_view_fraction']:7.1f}% "
              f"{r['gradient_mib']:5.0f} {ex['all_gather']:9.0f} {ex['all_gather_told_view']:8.0f} "
              f"{ex['all_gather_told_view_sh0']:6.0f} {ex['all_gather_told_view_sh1']:6.0f} "
              f"{ex['all_gather_told_view_sh2']:6.0f} {ex['routed']:7.0f} "
              f"{pack['nothing_held_us']:6.0f} {pack['in_view_us']:8.0f} {pack['one_row_held_us']:8.0f} "
              f"{unpack['zeroing_us']:7.0f} {unpack['into_zeros_us']:7.0f} {unpack['onto_own_rows_us']:8.0f} "
              f"{r['copy_of_gradients_us']:6.0f} {pack['peer_tiles_sh1_us']:9.0f} "
              f"{pack['peer_in_view_sh1_us']:9.0f}")  # fmt: skip
    print(
        f"(one rank on {record['device']}; microseconds, median of {args.runs}; graph ag / ag view / routed: the "
        "exchange's device part replayed from a CUDA graph, rows all-gathered (told the view's radii or not; sh0-2: "
        "told, at SH degree 0-2, only the values in use sent) / routed to owners; pk: pack kernel; unp 0s: unpack "
        "into gradients a clear pack left zero; unp own: the other rank's rows onto a rank's own, kept in place; pk "
        "tiles / whole: the pack as peer reads run it, at SH degree 1, the touched rows in tiles / every row in view "
        "sent whole)"
    )


if __name__ == "__main__":
    main()
