"""Does destroying an NCCL process group wait for a CUDA graph that recorded one of its collectives? (issue #4)

Two ranks on two GPUs record an all-reduce in a CUDA graph and replay it, then destroy the process group: once
with the graph freed first (what the trainer does since StepGraph.release), once with it still alive (what the
trainer did before). Each rank reports how long destroy_process_group took; a destroy still waiting after
--wait-s counts as hung (the rank then exits without finishing it). Prints a table last, writes --json.
Run on the two-GPU machine:
    python3 benchmarks/nccl_graph_exit.py --json $OUT/nccl_graph_exit.json
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, world: int, init: str, free_graph: bool, wait_s: float, result: str) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world)
    values = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(values)  # the communicator is made outside the recording
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph.capture_begin()
        dist.all_reduce(values)
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    if free_graph:
        graph.reset()

    def hung() -> None:
        Path(f"{result}.{rank}").write_text(json.dumps({"destroy_s": None}))
        os._exit(0)

    timer = threading.Timer(wait_s, hung)
    timer.start()
    began = time.perf_counter()
    dist.destroy_process_group()
    timer.cancel()
    Path(f"{result}.{rank}").write_text(json.dumps({"destroy_s": time.perf_counter() - began}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wait-s", type=float, default=20.0, help="a destroy still waiting after this is hung")
    parser.add_argument("--out", type=Path, default=Path("/tmp/nccl-graph-exit"))
    parser.add_argument("--json", type=Path, default=Path("nccl_graph_exit.json"))
    args = parser.parse_args()
    if torch.cuda.device_count() < 2:
        raise SystemExit("nccl_graph_exit.py needs two CUDA GPUs (the lent two-GPU machine).")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for free_graph in (True, False):
        result = str(args.out / f"free-{free_graph}")
        init = f"file://{args.out}/init-{time.time_ns()}"
        mp.spawn(_rank, args=(2, init, free_graph, args.wait_s, result), nprocs=2, join=True)
        times = [json.loads(Path(f"{result}.{r}").read_text())["destroy_s"] for r in range(2)]
        rows.append({"graph_freed_first": free_graph, "destroy_s_per_rank": times, "hung": None in times})
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
    gpu = f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}"
    record = {"gpu": gpu, "wait_s": args.wait_s, "torch": torch.__version__, "nccl": nccl, "runs": rows}
    args.json.write_text(json.dumps(record, indent=2) + "\n")
    print(f"{record['gpu']}, torch {record['torch']}, NCCL {record['nccl']}")
    print(f"{'graph freed first':<18} {'destroy_process_group, s per rank':<36} hung (> {args.wait_s:.0f} s)")
    for row in rows:
        shown = ", ".join("-" if t is None else f"{t:.3f}" for t in row["destroy_s_per_rank"])
        print(f"{str(row['graph_freed_first']):<18} {shown:<36} {row['hung']}")


if __name__ == "__main__":
    main()
