"""Where the compacted exchange's device time goes, on one GPU (issue #4).

With several GPUs and `--cuda-graph-several-gpus True` each rank's step graph holds the exchange's device part
(pack kernel, NCCL all-gather, unpack kernel; grad_compaction.py), so what it adds to a step is device time. This
measures it on one GPU, where the world is one rank (the all-gather copies locally): what is left is the packing
and unpacking every rank does whatever the links. For one view's gradients of three scenes:
- `room` and `object` (exchange_plans.py: 2M splats at 1920x1080, seen from inside, about 6% of the rows touched,
  and from outside, about 40%) and `object_50k` (50,000 splats at 800x800: lego's splat count after 7000 steps);
- the exchange's device part recorded as a CUDA graph and replayed, median of `--runs` replays (CUDA events): rows
  all-gathered (bytesplat's plan below 4 GPUs) and routed to owners (from 4);
- the pack kernel alone: with nothing held back from earlier steps (the steady state: the residual is not read)
  and with a row held back (after a step whose rows overflowed the capacity: the residual is read and rewritten,
  which every pack did before the held rows were counted); the unpack call alone (zeroing the gradients, adding
  the rows);
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

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from exchange_plans import object_camera  # noqa: E402
from fused_kernel import median_ms  # noqa: E402
from multi_gpu import ROOM_SPLATS, room_camera, room_splats, view_backward  # noqa: E402

from bytesplat_ns.cuda import ops  # noqa: E402
from bytesplat_ns.grad_compaction import SparseRowExchange  # noqa: E402

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


def settled(grads: list[torch.Tensor], routed: bool) -> tuple[SparseRowExchange, list[torch.Tensor]]:
    """An exchange whose capacities have adapted to `grads` (a few op-by-op exchanges), and gradients of its own."""
    exchange = SparseRowExchange(kernels=True, lag=1, all_to_all_from=1 if routed else 2)
    work = [g.clone() for g in grads]
    for _ in range(4):
        torch._foreach_copy_(work, grads)
        exchange.average(work)
    return exchange, work


def replayed_us(grads: list[torch.Tensor], routed: bool, runs: int) -> float:
    """The exchange's device part recorded as a CUDA graph, as the step graph holds it; median replay time."""
    exchange, work = settled(grads, routed)
    exchange.begin(work, 0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        exchange.exchange_rows(work)
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


def pack_us(grads: list[torch.Tensor], runs: int) -> dict[str, float]:
    """The pack kernel alone at the settled capacity: the residual holding no rows (the steady state: not read), and
    holding one (read, every row rewritten: what every pack did before the kernel counted the rows held)."""
    exchange, _ = settled(grads, routed=False)
    n, width = grads[0].shape[0], sum(g[0].numel() for g in grads)
    residual = torch.zeros(n, width, device=grads[0].device)
    held_rows = torch.zeros(1, dtype=torch.int32, device=residual.device)
    capacity = exchange.capacity
    steady = median_us(lambda: ops.pack_rows(grads, capacity, 0, False, residual, held_rows), runs)
    one_row = torch.zeros_like(residual)
    one_row[0] = 1e-3

    def hold_one_row() -> None:
        residual.copy_(one_row)
        held_rows.fill_(1)

    holding = median_us(lambda: ops.pack_rows(grads, capacity, 0, False, residual, held_rows), runs, hold_one_row)
    return {"capacity": capacity, "nothing_held_us": steady, "one_row_held_us": holding}


def unpack_us(grads: list[torch.Tensor], runs: int) -> float:
    """The unpack call alone (zeroing the gradients, adding one rank's rows): every touched row in one buffer."""
    buffer = ops.pack_rows(grads, grads[0].shape[0], 0, False)
    out = [torch.empty_like(g) for g in grads]
    return median_us(lambda: ops.unpack_rows(out, buffer, grads[0].shape[0], 1.0), runs)


def measure(scene: str, runs: int, device: torch.device) -> dict:
    n, make_camera, size = SCENES[scene]
    params = room_splats(n, seed=0, device=device)
    view_backward(params, make_camera(1, device, *size), "auto")
    grads = [p.grad.detach().clone() for p in params.values()]
    flat = torch.cat([g.reshape(n, -1) for g in grads], 1)  # [N, 59]
    copy = torch.empty_like(flat)
    return {
        "splats": n,
        "image": f"{size[0]}x{size[1]}",
        "touched_fraction": float(flat.ne(0).any(1).float().mean()),
        "gradient_mib": flat.numel() * 4 / 2**20,
        "exchange_replayed_us": {plan: replayed_us(grads, plan == "routed", runs) for plan in ("all_gather", "routed")},
        "pack": pack_us(grads, runs),
        "unpack_us": unpack_us(grads, runs),
        "copy_of_gradients_us": median_us(lambda: copy.copy_(flat), runs),
        "kernels_us_per_exchange": kernels_us(grads),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenes", nargs="+", default=list(SCENES), choices=list(SCENES))
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--json", type=Path, default=Path("exchange_cost.json"))
    args = parser.parse_args()
    device = torch.device("cuda")
    began = time.perf_counter()
    dist.init_process_group("nccl", init_method=f"file:///tmp/exchange-cost-{time.time_ns()}", rank=0, world_size=1)
    results = {scene: measure(scene, args.runs, device) for scene in args.scenes}
    dist.destroy_process_group()
    record = {"device": torch.cuda.get_device_name(0), "wall_s": time.perf_counter() - began, "scenes": results}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=2) + "\n")
    for scene, r in results.items():
        top = ", ".join(f"{k[:40]} {v:.0f}" for k, v in list(r["kernels_us_per_exchange"].items())[:4])
        print(f"{scene}: kernels per exchange (us): {top}")
    print(f"{'scene':<11} {'touched':>8} {'MiB':>6} {'graph ag':>9} {'routed':>8} {'pack':>7} {'pack held':>10} "
          f"{'unpack':>7} {'copy':>7}")  # fmt: skip
    for scene, r in results.items():
        ex, pack = r["exchange_replayed_us"], r["pack"]
        print(f"{scene:<11} {100 * r['touched_fraction']:7.1f}% {r['gradient_mib']:6.0f} {ex['all_gather']:9.0f} "
              f"{ex['routed']:8.0f} {pack['nothing_held_us']:7.0f} {pack['one_row_held_us']:10.0f} "
              f"{r['unpack_us']:7.0f} {r['copy_of_gradients_us']:7.0f}")  # fmt: skip
    print(
        f"(one rank on {record['device']}; microseconds, median of {args.runs}; graph ag / routed: the exchange's "
        "device part replayed from a CUDA graph, rows all-gathered / routed to owners)"
    )


if __name__ == "__main__":
    main()
