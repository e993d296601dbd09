"""What the screen exchange (screen_exchange.py) costs a rank's GPU against the compacted parameter rows, on one GPU
(issue #4).

On one GPU the world is one rank (the all-gather copies locally), so this measures each rank's own device work, not
the links; the bytes each plan would send to a peer come from its buffer sizes. For one view's gradients of
exchange_cost.py's scenes (`object_50k`: lego's splat count at 800x800; `room` and `object`: 2M splats at
1920x1080, seen from inside and from outside), median of `--runs` CUDA-graph replays (CUDA events):
- compacted rows (grad_compaction.py, all-gathered, told the view's radii): the exchange's device part, as the step
  graph holds it on two GPUs;
- screen: its device part for one rank (pack, all-gather, backprop of the view), and the backprop of two views (what
  each of two ranks runs: every rank's projection and SH, forward and backward);
- the render, loss and backward all the way to the parameters against the same stopped at the screen-space splats,
  each replayed from a CUDA graph: what the screen exchange saves each rank's own step;
- bytes to each peer: compacted at the capacity settled on this view, screen 9 values a splat.
Prints a table last, writes --json.

    python3 benchmarks/screen_exchange_cost.py --json $OUT/screen_exchange_cost.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from exchange_cost import SCENES, median_us, replayed_us, settled, view_gradients  # noqa: E402
from multi_gpu import room_splats  # noqa: E402

from bytesplat_ns.render import RasterCamera, RasterizeOptions, Splats, rasterize  # noqa: E402
from bytesplat_ns.render.bin_capacity import EXACT  # noqa: E402
from bytesplat_ns.render.screen_space import screen_space  # noqa: E402
from bytesplat_ns.screen_exchange import HEADER, ROW, RenderedView, ScreenExchange  # noqa: E402
from bytesplat_ns.step_graph import _FixedBins  # noqa: E402

OPTS = RasterizeOptions(sh_degree=3, backend="fused")


def splats_of(params: dict[str, torch.Tensor]) -> Splats:
    return Splats(params["means"], params["quats"], params["scales"].exp(), params["opacities"].sigmoid().squeeze(-1),
                  params["features_dc"], params["features_rest"])  # fmt: skip


def graph_us(fn, runs: int) -> float:
    """`fn` recorded as a CUDA graph; median replay microseconds."""
    fn()  # first use outside the recording (lazy set-up)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        fn()
    return median_us(graph.replay, runs)


def fixed_bins(render: Callable[[RasterizeOptions], object]) -> tuple[RasterizeOptions, int]:
    """Options whose tile binning has a fixed capacity, as in training (a recording cannot read the exact count):
    1.25 x the entries of one exact binning by `render` (called once with the options to use; what it returns is
    dropped, so no autograd graph of it outlives the call). -> (those options, the exact entry count)"""
    probe = _FixedBins(EXACT)
    render(replace(OPTS, bins=probe))
    entries = int(probe.total.item())
    return replace(OPTS, bins=_FixedBins(int(1.25 * entries) + 1)), entries


def step_us(params: dict[str, torch.Tensor], camera: RasterCamera, runs: int) -> dict[str, float]:
    """The render (tile binning at a fixed capacity, as in training), an L1 loss against grey and its backward, all
    the way to the parameters or stopped at the screen-space splats, each recorded as a CUDA graph; median replay
    microseconds. Their difference is the projection and SH backward that the screen exchange moves into its
    backprop of every view."""
    opts, _ = fixed_bins(lambda probe: rasterize(splats_of(params), camera, probe))

    def step(to_screen: bool) -> None:
        out = rasterize(splats_of(params), camera, opts)
        loss = out.rgb.sub(0.5).abs().mean()
        loss.backward(inputs=out.screen.differentiable() if to_screen else None)

    times = {"full_us": graph_us(lambda: step(False), runs), "to_screen_us": graph_us(lambda: step(True), runs)}
    for p in params.values():
        p.grad = None
    return times


def measure(params: dict[str, torch.Tensor], camera: RasterCamera, runs: int) -> dict:
    n = params["means"].shape[0]
    grads, visible = view_gradients(params, camera)
    compact, _ = settled(grads, routed=False)
    row_bytes = 4 * (1 + sum(g[0].numel() for g in grads))

    out = rasterize(splats_of(params), camera, OPTS)
    out.rgb.sub(0.5).abs().mean().backward(inputs=out.screen.differentiable())
    screen = out.screen.detached()  # no autograd graph of an op-by-op render alive while recording (step_graph.py)
    del out
    leaves = list(params.values())
    view = RenderedView(screen, camera, lambda c: screen_space(splats_of(params), c, OPTS, "fused"), leaves)
    exchange = ScreenExchange(lag=1)

    def one_rank() -> None:
        exchange.begin(leaves, 0)
        exchange.exchange(view)

    exchange.begin(leaves, 0)
    send = exchange.pack(screen, camera)
    two_views = torch.cat([send, send])  # [2, 9 N + HEADER]: two ranks' rows (the same view twice)
    record = {
        "splats": n,
        "image": f"{camera.width}x{camera.height}",
        "in_view_fraction": float(visible.ne(0).float().mean()),
        "compact_replayed_us": replayed_us(grads, False, runs, visible),
        "screen_replayed_us": graph_us(one_rank, runs),
        "screen_unpack_two_views_us": graph_us(lambda: exchange.unpack(two_views, view), runs),
        "render_and_backward": step_us(params, camera, runs),
        "compact_bytes_to_a_peer": (compact.capacity + 1) * row_bytes,
        "screen_bytes_to_a_peer": (ROW * n + HEADER) * 4,
    }
    for p in leaves:
        p.grad = None
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenes", nargs="+", default=["object_50k", "room", "object"], choices=list(SCENES))
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--json", type=Path, default=Path("screen_exchange_cost.json"))
    args = parser.parse_args()
    device = torch.device("cuda")
    began = time.perf_counter()
    dist.init_process_group("nccl", init_method=f"file:///tmp/screen-cost-{time.time_ns()}", rank=0, world_size=1)
    results = {}
    for scene in args.scenes:
        n, make_camera, size = SCENES[scene]
        results[scene] = measure(room_splats(n, seed=0, device=device), make_camera(1, device, *size), args.runs)
    dist.destroy_process_group()
    record = {"device": torch.cuda.get_device_name(0), "wall_s": time.perf_counter() - began, "scenes": results}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=2) + "\n")
    print(f"{'scene':<11} {'in view':>7} {'compact':>8} {'screen':>7} {'2 views':>8} {'step full':>9} {'to scr':>8} "
          f"{'MB cmp':>7} {'MB scr':>7}")  # fmt: skip
    for scene, r in results.items():
        step = r["render_and_backward"]
        print(f"{scene:<11} {100 * r['in_view_fraction']:6.1f}% {r['compact_replayed_us']:8.0f} "
              f"{r['screen_replayed_us']:7.0f} {r['screen_unpack_two_views_us']:8.0f} {step['full_us']:9.0f} "
              f"{step['to_screen_us']:8.0f} {r['compact_bytes_to_a_peer'] / 1e6:7.1f} "
              f"{r['screen_bytes_to_a_peer'] / 1e6:7.1f}")  # fmt: skip
    print(
        f"(one rank on {record['device']}; microseconds, median of {args.runs}; compact / screen: the exchange's "
        "device part replayed from a CUDA graph; 2 views: the screen exchange's backprop of two ranks' views; step "
        "full / to scr: render, loss and backward to the parameters / stopped at the screen-space splats, replayed; "
        "MB: bytes to each peer)"
    )


if __name__ == "__main__":
    main()
