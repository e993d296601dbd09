"""Can ranks read each other's gradient buffers directly (PyTorch symmetric memory), inside a CUDA graph? (#4)

The compacted exchange all-gathers buffers of a fixed capacity (the step graph needs fixed sizes), so on the room
each rank sends 44% of the splats' rows a step where its view touched 18% (benchmarks/RESULTS.md, thirty-eighth
session). A rank that reads its peers' buffers itself reads only the rows their headers count. This probe checks,
on the machine it runs on, what that needs: `torch.distributed._symmetric_memory` buffers shared by `--ranks`
processes (on one GPU when there is one, else one GPU each), a peer's rows read by a plain copy, and the
symmetric memory's barrier recorded in a CUDA graph and replayed; and it times a replayed barrier.

    python3 benchmarks/peer_memory_probe.py --ranks 2 --json $OUT/peer_memory_probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, world: int, init: str, out: str) -> None:
    record: dict = {"rank": rank}
    try:
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        record["device"] = str(device)
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
        import torch.distributed._symmetric_memory as symm_mem

        rows, width = 4096, 64
        mine = symm_mem.empty(rows, width, dtype=torch.float32, device=device)
        handle = symm_mem.rendezvous(mine, dist.group.WORLD)
        record["rendezvous"] = True
        mine.fill_(rank + 1)
        handle.barrier(channel=0)
        peers = [handle.get_buffer(p, (rows, width), torch.float32) for p in range(world)]
        record["peer_read_ok"] = all(bool((peers[p] == p + 1).all()) for p in range(world))
        handle.barrier(channel=0)

        got = torch.zeros(world, rows, width, device=device)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            with torch.cuda.graph(graph, stream=stream):
                mine.add_(world)  # this rank's next "step" of rows
                handle.barrier(channel=0)  # every rank's rows written
                for p in range(world):
                    got[p].copy_(peers[p])
                handle.barrier(channel=1)  # every rank done reading
        torch.cuda.synchronize()
        replays_ok = True
        for i in range(1, 21):
            graph.replay()
            torch.cuda.synchronize()
            replays_ok &= all(bool((got[p] == p + 1 + i * world).all()) for p in range(world))
        record["graph_replays_ok"] = replays_ok

        barrier_graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            with torch.cuda.graph(barrier_graph, stream=stream):
                for _ in range(10):
                    handle.barrier(channel=2)
        torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(100):
            barrier_graph.replay()
        torch.cuda.synchronize()
        record["barrier_us"] = (time.perf_counter() - start) / 1000 * 1e6
        del graph, barrier_graph
        dist.barrier()
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the probe reports what failed
        record["error"] = traceback.format_exc()[-2000:]
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--json", type=Path, default=Path("peer_memory_probe.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{os.path.join(tmp, 'init')}"
        mp.start_processes(_rank, args=(args.ranks, init, tmp), nprocs=args.ranks, start_method="spawn", join=True)
        records = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(args.ranks)]
    result = {"torch": torch.__version__, "gpus": torch.cuda.device_count(), "ranks": records}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    sys.exit(0 if all("error" not in r for r in records) else 1)


if __name__ == "__main__":
    main()
