"""Host time of the compacted gradient exchange and of each of its parts, on 2 GPUs (issue #4).

The training step is bound by the host (benchmarks/RESULTS.md), so what a second GPU costs is the host time
the exchange adds to each step. This spawns 2 NCCL ranks holding lego-sized splat gradients (300k splats, the
six splat parameters, 59 values a row, 60% of the rows non-zero and different on each rank) and times, per
call and on the host only (the GPU is idle at the start of each call, as in a host-bound step):
- the whole exchange (`SparseRowExchange.average`, pack/unpack kernels; and with torch operations),
- its parts alone: the pack kernel, the all-gather (torch.distributed's function, and the process group's
  method that it calls), the unpacking (zero, every rank's rows), the late header read,
- a dense all-reduce of the same gradients, and one trivial torch op (this machine's cost per op);
and a cProfile of the whole exchange (which Python functions and torch calls take the host's time).
Writes a JSON (--json) and prints a table last. Run on the GPU machine:
    python benchmarks/exchange_host.py --json $OUT/exchange_host.json
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import os
import pstats
import time
from pathlib import Path
from statistics import mean, median

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bytesplat_ns.cuda import ops
from bytesplat_ns.grad_compaction import SparseRowExchange, all_reduce_mean
from bytesplat_ns.late_read import LateQueue

SPLATS = 300_000
SHAPES = {"means": (3,), "scales": (3,), "quats": (4,), "features_dc": (3,), "features_rest": (15, 3),
          "opacities": (1,)}  # fmt: skip
VISIBLE = 0.6
CALLS = 300


def lego_like_grads(rank: int, device: torch.device) -> list[torch.Tensor]:
    """The six splat gradients with VISIBLE of the rows non-zero (a different draw per rank)."""
    g = torch.Generator().manual_seed(rank)
    seen = (torch.rand(SPLATS, generator=g) < VISIBLE).float()
    return [(torch.randn(SPLATS, *shape, generator=g) * seen.view(-1, *[1] * len(shape))).to(device)
            for shape in SHAPES.values()]  # fmt: skip


def host_ms(fn, sync, reset) -> dict:
    """Median and mean host milliseconds of `fn` over CALLS calls, the GPU idle at the start of each (`reset`,
    untimed, before each call)."""
    for _ in range(20):
        reset()
        fn()
    times = []
    for _ in range(CALLS):
        reset()
        sync()
        start = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - start))
    return {"median_ms": median(times), "mean_ms": mean(times)}


def python_profile(fn, sync, reset, top: int = 12) -> dict:
    """cProfile of CALLS calls of `fn`: the functions (torch calls included) taking the most time, in host ms per
    call (cProfile's own overhead inflates them; compare them with each other)."""
    profiler = cProfile.Profile()
    for _ in range(CALLS):
        reset()
        sync()
        profiler.enable()
        fn()
        profiler.disable()
    stats = pstats.Stats(profiler)
    rows = sorted(stats.stats.items(), key=lambda item: item[1][2], reverse=True)[:top]  # by own (total) time
    return {f"{Path(file).name}:{line}({name})": 1000 * own / CALLS for (file, line, name), (_, _, own, _, _) in rows}


def _rank(rank: int, world: int, init: str, result: str) -> None:
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world)

    def sync() -> None:
        torch.cuda.synchronize()
        dist.barrier()
        torch.cuda.synchronize()

    original = lego_like_grads(rank, device)
    grads = [g.clone() for g in original]  # the exchange averages in place: reset before every call

    def reset() -> None:
        torch._foreach_copy_(grads, original)

    kernels, plain = SparseRowExchange(kernels=True), SparseRowExchange(kernels=False)
    for _ in range(3):  # the capacity settles from the gathered counts
        kernels.average([g.clone() for g in original])
        plain.average([g.clone() for g in original])
    capacity = kernels.capacity
    residual = original[0].new_zeros(SPLATS, sum(math.prod(shape) for shape in SHAPES.values()))
    held = torch.zeros(1, dtype=torch.int32, device=residual.device)  # rows the residual holds
    buffer = ops.pack_rows(grads, capacity, 0, False, residual, held)
    gathered = buffer.new_empty(world, *buffer.shape[1:])  # [W, capacity + 1, 1 + D]
    group = dist.distributed_c10d._get_default_group()
    late, headers = LateQueue(lag=4), gathered[:, 0, :3].contiguous().view(torch.int32)
    parts = {
        "exchange (kernels)": lambda: kernels.average(grads),
        "exchange (torch ops)": lambda: plain.average(grads),
        "pack kernel": lambda: ops.pack_rows(grads, capacity, 0, False, residual, held),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(gathered, buffer),
        "group._allgather_base": lambda: group._allgather_base(gathered, buffer).wait(),
        "unpack (zero, W ranks)": lambda: ops.unpack_rows(grads, gathered, capacity, 0.5),
        "late header read": lambda: (late.pop_ready(), late.push(headers)),
        "dense all-reduce": lambda: all_reduce_mean(grads),
        "one torch op (add_)": lambda: grads[5].add_(0.0),
    }
    rows = {name: host_ms(fn, sync, reset) for name, fn in parts.items()}
    rows["capacity_rows"] = capacity
    rows["python_profile"] = python_profile(lambda: kernels.average(grads), sync, reset)
    if rank == 0:
        Path(result).write_text(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path, default=Path("/tmp/exchange_host.json"))
    args = parser.parse_args()
    if torch.cuda.device_count() < 2:
        raise SystemExit("exchange_host.py needs 2 GPUs (the nvidia-h200-x2 machine).")
    ops.ext()  # build or load the extension once, before the ranks start
    scratch = Path("/tmp/exchange-host")
    scratch.mkdir(parents=True, exist_ok=True)
    result = scratch / "rank0.json"
    mp.spawn(_rank, args=(2, f"file://{scratch}/init-{time.time_ns()}", str(result)), nprocs=2, join=True)
    rows = json.loads(result.read_text())
    record = {"gpu": f"2x {torch.cuda.get_device_name(0)}", "splats": SPLATS, "visible": VISIBLE, "calls": CALLS,
              "rank0": rows}  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=2) + "\n")
    print(f"{record['gpu']}, {SPLATS} splats, {VISIBLE:.0%} rows non-zero, capacity {rows['capacity_rows']} rows")
    print(f"{'part (rank 0, host)':<26} {'median ms':>9} {'mean ms':>8}")
    print("python profile of the exchange (own ms per call, under cProfile):")
    for name, ms in rows["python_profile"].items():
        print(f"  {ms:7.4f}  {name}")
    for name, row in rows.items():
        if isinstance(row, dict) and "median_ms" in row:
            print(f"{name:<26} {row['median_ms']:9.3f} {row['mean_ms']:8.3f}")


if __name__ == "__main__":
    main()
