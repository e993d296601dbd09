"""Start-up: the initial splat sizes (each point's distances to its 3 nearest neighbours) for N seed points, by
splatfacto's single-threaded sklearn search against bytesplat's KD-tree on every core (model.neighbour_distances);
the same numbers (checked). Table last; --json writes the timings.

    python3 benchmarks/init_neighbours.py --points 100000 2000000 --json benchmarks/results/init_neighbours.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from nerfstudio.models.splatfacto import SplatfactoModel

from bytesplat_ns.model import neighbour_distances


def timed(fn, *args):
    began = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, nargs="+", default=[100_000, 2_000_000])
    parser.add_argument("--json", type=Path, default=Path("init_neighbours.json"))
    args = parser.parse_args()
    rows = []
    for n in args.points:
        points = torch.randn(n, 3, generator=torch.Generator().manual_seed(n))
        ours, ours_s = timed(neighbour_distances, points, 3)
        (theirs, _), theirs_s = timed(SplatfactoModel.k_nearest_sklearn, None, points, 3)
        assert torch.equal(ours, torch.from_numpy(theirs)), "the distances differ"
        rows.append({"points": n, "sklearn_s": theirs_s, "kdtree_all_cores_s": ours_s, "speedup": theirs_s / ours_s})
    report = {"cpus": os.cpu_count(), "rows": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\n{'points':>10} {'sklearn s':>10} {'KD-tree s':>10} {'speedup':>8}   ({os.cpu_count()} CPUs)")
    for r in rows:
        print(f"{r['points']:>10,} {r['sklearn_s']:>10.2f} {r['kdtree_all_cores_s']:>10.2f} {r['speedup']:>7.1f}x")


if __name__ == "__main__":
    main()
