"""Kernel-level benchmark of the fused rasterizer (H200): fused forward+backward against gsplat 1.4.0's
rasterize_to_pixels forward+backward on the same projected splats and tile lists.

Scenes (synthetic unless --lego-ckpt gives a trained nerfstudio checkpoint): "lego" ~300k splats around an
object at 800x800, and "wide" >= 2M splats filling a 1920x1080 view. Per scene, one training step's
rasterization with an L1 loss against a random target, each variant timed with CUDA events (median of STEP_ITERS steps;
each step's fresh copies of the projected inputs, the leaves its gradients land in, are made before its start event):
  gsplat          rasterize_to_pixels forward, torch loss, autograd backward (absgrad on)
  fused_autograd  our forward kernel (keeping its state), torch loss, our fused kernel resuming from that state
                  for the backward pass, through autograd
  fused_l1        our fused kernel with the L1 loss formed on-chip: one launch (the headline)
  fused_l1_pruned fused_l1 on the tile lists pruned to the on-chip capacity, as training renders (fewer entries than
                  the others where a tile overflows, so a different image: timed, left out of the error check)
  fused_ssim      splatfacto's 0.8 L1 + 0.2 D-SSIM through fused_loss_raster (render keeping the state, the SSIM
                  kernels as in training, the fused kernel resuming from the state)
plus tile binning's pruning (capacity, entries pruned). Every variant runs on the same tile lists (our binning), on
tiles of the renderer's side for the image size (ops.tile_size_for: 16 pixels for these scenes) or --tile-size's.
--ncu reruns each variant under Nsight Compute (--clock-control none) for one step: dram__bytes_read.sum +
dram__bytes_write.sum over all of the step's kernels, and gpu__time_duration.sum of its rasterization kernels alone
(RASTER_KERNELS: gsplat's forward and backward, our fused or forward and backward kernels), without the launches,
loss kernels and host time the CUDA-event timings include.
Writes --json (benchmarks/results/fused_kernel.json) and prints a table.
"""

from __future__ import annotations

import argparse
import csv
import functools
import io
import json
import math
import operator
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bytesplat_ns.cuda import ops  # noqa: E402
from bytesplat_ns.render.fused_backend import FusedLoss, fused_loss_raster, prepare  # noqa: E402
from bytesplat_ns.render.types import RasterCamera, RasterizeOptions, Splats  # noqa: E402
from bytesplat_ns.ssim import SSIMTerm  # noqa: E402

VARIANTS = ("gsplat", "fused_autograd", "fused_l1", "fused_l1_pruned", "fused_ssim")
SCENES = {"lego": (300_000, 800, 800), "wide": (2_200_000, 1920, 1080)}
DRAM_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
TIME_METRIC = "gpu__time_duration.sum"
RASTER_KERNELS = ("rasterize_to_pixels", "fused_kernel", "forward_kernel")  # substrings of the kernels' names
NCU_VARIANTS = ("gsplat", "fused_autograd", "fused_l1", "fused_l1_pruned")
STEP_WARMUP, STEP_ITERS = 5, 50  # steps of each variant before timing, and timed (CUDA events, median)


def synthetic(name: str, seed: int = 0) -> tuple[Splats, RasterCamera]:
    count, width, height = SCENES[name]
    g = torch.Generator(device="cuda").manual_seed(seed)
    rand = lambda *s: torch.rand(*s, generator=g, device="cuda")  # noqa: E731
    randn = lambda *s: torch.randn(*s, generator=g, device="cuda")  # noqa: E731
    focal = 1111.0 if name == "lego" else 1400.0
    if name == "lego":  # an object of radius ~1 at distance 4, filling the middle of the view
        means = randn(count, 3) * torch.tensor([0.45, 0.45, 0.45], device="cuda") + torch.tensor(
            [0.0, 0.0, 4.0], device="cuda"
        )
        scales = torch.exp(math.log(0.002) + math.log(10.0) * rand(count, 3))
    else:  # a whole view: depths 2..30, footprints 0.5..8 px
        z = 2.0 + 28.0 * rand(count)
        xy = (rand(count, 2) - 0.5) * torch.tensor([width, height], device="cuda") * 1.2 / focal * z[:, None]
        means = torch.cat([xy, z[:, None]], dim=-1)
        scales = (0.5 * 16.0 ** rand(count, 1)) * z[:, None] / focal * torch.exp(0.4 * randn(count, 3))
    quats = randn(count, 4)
    opacities = torch.sigmoid(1.5 * randn(count) + 0.5)
    colors = 0.3 * randn(count, 16, 3)
    colors[:, 0] = randn(count, 3)
    K = torch.tensor([[focal, 0, width / 2], [0, focal, height / 2], [0, 0, 1]], device="cuda")
    return Splats(means, quats, scales, opacities, colors), RasterCamera(torch.eye(4, device="cuda"), K, width, height)


def from_checkpoint(path: Path, width: int, height: int) -> tuple[Splats, RasterCamera]:
    """A trained nerfstudio splat checkpoint, seen from a camera 4 units out on -z looking at the origin."""
    state = torch.load(path, map_location="cuda", weights_only=False)["pipeline"]
    get = lambda k: state[f"_model.gauss_params.{k}"].float()  # noqa: E731
    colors = torch.cat([get("features_dc")[:, None], get("features_rest")], dim=1)
    splats = Splats(
        get("means"), get("quats"), torch.exp(get("scales")), torch.sigmoid(get("opacities")).squeeze(-1), colors
    )
    view = torch.eye(4, device="cuda")
    view[2, 3] = 4.0
    K = torch.tensor([[1111.0, 0, width / 2], [0, 1111.0, height / 2], [0, 0, 1]], device="cuda")
    return splats, RasterCamera(view, K, width, height)


class Bench:
    """One scene's projected splats (detached leaves) and every variant's step."""

    def __init__(self, splats: Splats, camera: RasterCamera):
        opts = RasterizeOptions(sh_degree=3, prune_on_chip=False)
        with torch.no_grad():
            prep = prepare(splats, camera, opts, with_depth=False)
            pruned_prep = prepare(splats, camera, RasterizeOptions(sh_degree=3, prune_on_chip=True), with_depth=False)
        self.w, self.h = camera.width, camera.height
        self.means2d = prep.means2d.detach().contiguous()  # [1, N, 2]
        self.conics = prep.conics[0].detach().contiguous()
        self.colors = prep.colors[0].detach().contiguous()
        self.opacities = prep.opacities[0].detach().contiguous()
        self.tiles, self.capacity = prep.tiles, prep.capacity
        self.pruned_tiles = pruned_prep.tiles
        counts = (prep.tiles.end - prep.tiles.start).long()
        self.stats = {
            "splats": int(splats.count), "visible": int((prep.radii > 0).sum()), "entries": int(counts.sum()),
            "max_per_tile": int(counts.max()), "capacity": self.capacity, "tile_size": prep.tiles.tile_size,
            "tiles_over_capacity": int((counts > self.capacity).sum()), "pruned": int(pruned_prep.tiles.pruned.item()),
        }  # fmt: skip
        self.offsets = prep.tiles.start.reshape(1, prep.tiles.tiles_y, prep.tiles.tiles_x)
        g = torch.Generator(device="cuda").manual_seed(1)
        self.gt = torch.rand(self.h, self.w, 3, generator=g, device="cuda")
        self.bg = torch.tensor([1.0, 1.0, 1.0], device="cuda")

    def leaves(self):
        return [t.clone().requires_grad_(True) for t in (self.means2d, self.conics, self.colors, self.opacities)]

    def step(self, variant: str, capacity: int | None = None, leaves: list | None = None):
        """One forward+backward of `variant` into `leaves` (default: fresh ones); `capacity`: the fused kernel's
        on-chip splats per tile (default: the renderer's, from ops.BLOCKS_PER_SM)."""
        capacity = capacity or self.capacity
        m, c, col, o = leaves = leaves or self.leaves()
        if variant == "gsplat":
            from gsplat.cuda._wrapper import rasterize_to_pixels

            render, alpha = rasterize_to_pixels(m, c[None], col[None], o[None], self.w, self.h, self.tiles.tile_size,
                                                self.offsets, self.tiles.ids, absgrad=True)  # fmt: skip
            render, alpha = render[0], alpha[0]
            loss = ((render + (1 - alpha) * self.bg).clamp(0, 1) - self.gt).abs().mean()
        elif variant == "fused_autograd":
            render, alpha = ops.rasterize_pixels(m, c, col, o, self.tiles, self.w, self.h, capacity, absgrad=True)
            loss = ((render + (1 - alpha) * self.bg).clamp(0, 1) - self.gt).abs().mean()
        else:
            weights = FusedLoss(ssim_fn=SSIMTerm()) if variant == "fused_ssim" else FusedLoss(l1=1.0, ssim=0.0)
            tiles = self.pruned_tiles if variant == "fused_l1_pruned" else self.tiles
            loss, _, _ = fused_loss_raster(m, c, col, o, tiles, self.gt, self.bg, weights, capacity,
                                           absgrad=True)  # fmt: skip
        loss.backward()
        return loss, [leaf.grad for leaf in leaves] + [m.absgrad]


def median_ms(fn, warmup: int = 3, iters: int = 15, setup=None) -> float:
    """Median CUDA-event time of fn(), or of fn(setup()) with setup() run (and queued) before the start event."""
    times = []
    for i in range(warmup + iters):
        args = [] if setup is None else [setup()]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def step_ms(bench: Bench, variant: str, capacity: int | None = None) -> float:
    """Median time of `variant`'s step, its input copies made before each start event (STEP_WARMUP, STEP_ITERS)."""
    run = functools.partial(bench.step, variant, capacity)  # run(leaves)
    return median_ms(run, warmup=STEP_WARMUP, iters=STEP_ITERS, setup=bench.leaves)


def errors(bench: Bench) -> dict:
    """fused_autograd and fused_l1 against gsplat on the same inputs (both float32)."""
    out = {}
    from gsplat.cuda._wrapper import rasterize_to_pixels

    with torch.no_grad():
        ref, _ = rasterize_to_pixels(bench.means2d, bench.conics[None], bench.colors[None], bench.opacities[None],
                                     bench.w, bench.h, bench.tiles.tile_size, bench.offsets,
                                     bench.tiles.ids)  # fmt: skip
        mine, _, _ = ops.render_pixels(bench.means2d, bench.conics, bench.colors, bench.opacities, bench.tiles,
                                    bench.w, bench.h)  # fmt: skip
    err = (mine - ref[0]).abs().amax(dim=-1)  # [H, W]
    out["max_abs_err_image"] = err.max().item()
    out["pixels_over_1e-4"] = (err > 1e-4).float().mean().item()  # cut-off decisions taken otherwise than gsplat's
    _, g_ref = bench.step("gsplat")
    rel = []
    for variant in ("fused_autograd", "fused_l1"):
        _, g = bench.step(variant)
        rel += [((a - b).norm() / b.norm().clamp_min(1e-30)).item() for a, b in zip(g, g_ref)]
    out["max_rel_err_grad"] = max(rel)
    return out


def ncu_step(scene: str, variant: str, lego_ckpt: str | None, tile_size: int | None) -> dict | None:
    """One step of `variant` under Nsight Compute: {"dram_bytes": read + written by all its kernels,
    "raster_kernel_ms": GPU time of its rasterization kernels}, or None when ncu gave nothing."""
    metrics = ",".join((*DRAM_METRICS, TIME_METRIC))
    cmd = ["ncu", "--clock-control", "none", "--profile-from-start", "off", "--metrics", metrics, "--csv",
           "--print-units", "base", sys.executable, __file__, "--ncu-child", scene, variant]  # fmt: skip
    if tile_size is not None:
        cmd += ["--tile-size", str(tile_size)]
    if lego_ckpt:
        cmd += ["--lego-ckpt", lego_ckpt]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    except (OSError, subprocess.TimeoutExpired) as error:
        print(f"ncu {scene}/{variant}: {error}", flush=True)
        return None
    rows = [r for r in csv.reader(io.StringIO(result.stdout)) if len(r) > 3]
    if not rows:
        print(f"ncu {scene}/{variant}: no metrics (rc {result.returncode}): {result.stderr[-400:]}", flush=True)
        return None
    header = rows[0]
    kernel_col, name_col = header.index("Kernel Name"), header.index("Metric Name")
    value_col = header.index("Metric Value")
    value = lambda r: float(r[value_col].replace(",", ""))  # noqa: E731
    raster_ns = sum(
        value(r)
        for r in rows[1:]
        if r[name_col] == TIME_METRIC and any(k in r[kernel_col] for k in RASTER_KERNELS)
    )  # fmt: skip
    return {
        "dram_bytes": sum(value(r) for r in rows[1:] if r[name_col] in DRAM_METRICS),
        "raster_kernel_ms": raster_ns / 1e6,  # --print-units base: nanoseconds
    }


def step_speedup(scenes: dict, variant: str) -> dict:
    """{scene: gsplat's step time over `variant`'s} (the CUDA-event medians)."""
    return {n: r["ms"]["gsplat"] / r["ms"][variant] for n, r in scenes.items()}


def ncu_ratio(scenes: dict, key: str, f, variant: str = "fused_l1") -> dict | None:
    """{scene: f(gsplat's value, `variant`'s)} of an ncu figure (`key`) over the scenes where ncu gave both."""
    return {
        n: f(r[key]["gsplat"], r[key][variant])
        for n, r in scenes.items()
        if r.get(key) and r[key]["gsplat"] and r[key][variant]
    } or None


def scene_for(name: str, lego_ckpt: str | None) -> tuple[Splats, RasterCamera]:
    if name == "lego" and lego_ckpt:
        return from_checkpoint(Path(lego_ckpt), *SCENES["lego"][1:])
    return synthetic(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "fused_kernel.json")
    parser.add_argument("--lego-ckpt", default=None, help="a trained lego .ckpt (else a synthetic lego-like scene)")
    parser.add_argument("--scenes", nargs="+", default=list(SCENES))
    parser.add_argument("--ncu", action="store_true", help="also measure DRAM bytes with Nsight Compute")
    parser.add_argument(
        "--blocks-per-sm",
        type=int,
        nargs="*",
        default=[],
        help="also time the fused kernel with the on-chip capacity of this many blocks per SM",
    )
    parser.add_argument(
        "--tile-size",
        type=int,
        choices=(ops.TILE_SIZE, ops.SMALL_TILE_SIZE),
        default=None,
        help="bin and rasterize every variant on tiles of this side (default: the renderer's choice)",
    )
    parser.add_argument("--ncu-child", nargs=2, metavar=("SCENE", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tile_size is not None:
        ops.tile_size_for = lambda width, height, device: args.tile_size  # read by prepare() for every variant

    if args.ncu_child:  # one profiled step under ncu
        bench = Bench(*scene_for(args.ncu_child[0], args.lego_ckpt))
        for _ in range(2):
            bench.step(args.ncu_child[1])
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        bench.step(args.ncu_child[1])
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        return

    started = time.time()
    results: dict = {"gpu": torch.cuda.get_device_name(), "blocks_per_sm": ops.BLOCKS_PER_SM, "scenes": {}}
    for name in args.scenes:
        bench = Bench(*scene_for(name, args.lego_ckpt))
        row = dict(bench.stats)
        row["ms"] = {v: step_ms(bench, v) for v in VARIANTS}
        row["ms_by_blocks_per_sm"] = {}
        for blocks in args.blocks_per_sm:
            capacity = ops.tile_capacity(torch.device("cuda"), 3, bench.tiles.tile_size, blocks)
            row["ms_by_blocks_per_sm"][blocks] = {"capacity": capacity} | {
                v: step_ms(bench, v, capacity) for v in ("fused_autograd", "fused_l1")
            }
        row.update(errors(bench))
        if args.ncu:
            profiled = {v: ncu_step(name, v, args.lego_ckpt, args.tile_size) for v in NCU_VARIANTS}
            for key in ("dram_bytes", "raster_kernel_ms"):
                row[key] = {v: (p or {}).get(key) for v, p in profiled.items()}
        results["scenes"][name] = row
        print(f"{name}: {json.dumps(row)}", flush=True)
        del bench
        torch.cuda.empty_cache()

    scenes = results["scenes"]
    rows = scenes.values()
    results["speedup_vs_gsplat"] = step_speedup(scenes, "fused_l1")
    results["speedup_vs_gsplat_pruned"] = step_speedup(scenes, "fused_l1_pruned")
    results["speedup_autograd_vs_gsplat"] = step_speedup(scenes, "fused_autograd")
    results["ssim_cost_ms"] = {n: r["ms"]["fused_ssim"] - r["ms"]["fused_l1"] for n, r in scenes.items()}
    results["dram_bytes_reduction"] = ncu_ratio(scenes, "dram_bytes", lambda gs, fu: 1.0 - fu / gs)
    results["kernel_speedup_vs_gsplat"] = ncu_ratio(scenes, "raster_kernel_ms", operator.truediv)
    results["kernel_speedup_vs_gsplat_pruned"] = ncu_ratio(
        scenes, "raster_kernel_ms", operator.truediv, "fused_l1_pruned"
    )
    results["max_abs_err_image"] = max(r["max_abs_err_image"] for r in rows)
    results["max_rel_err_grad"] = max(r["max_rel_err_grad"] for r in rows)
    results["pixels_over_1e-4"] = max(r["pixels_over_1e-4"] for r in rows)
    for key in ("psnr_fused_7k", "psnr_splatfacto_7k", "psnr_fused_30k", "psnr_splatfacto_30k"):
        results[key] = None  # training runs: not part of this kernel-level script
    results["notes"] = ("errors are fused vs gsplat on the same float32 inputs (the tests compare against the "
                        "float64 reference). The kernels evaluate the falloff in base 2 from coefficients computed "
                        "once per cached splat, gsplat in base e per pixel: a (pixel, splat) pair within rounding of "
                        "the 1/255 or transmittance cut-off can be decided otherwise, shifting that pixel by up to "
                        "the splat's share; pixels_over_1e-4 is the fraction of pixels more than 1e-4 apart. PSNR "
                        "keys need training runs with the fused loss in model.py")  # fmt: skip
    results["wall_s"] = time.time() - started
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")

    print(f"\n{'scene':6} {'variant':15} {'ms':>8} {'x gsplat':>9} {'DRAM MB':>9} {'kernel ms':>10}")
    for name, r in results["scenes"].items():
        for v in VARIANTS:
            dram, kernel = (r.get("dram_bytes") or {}).get(v), (r.get("raster_kernel_ms") or {}).get(v)
            mb = f"{dram / 1e6:9.1f}" if dram else f"{'-':>9}"
            kms = f"{kernel:10.3f}" if kernel else f"{'-':>10}"
            print(f"{name:6} {v:15} {r['ms'][v]:8.3f} {r['ms']['gsplat'] / r['ms'][v]:9.2f} {mb} {kms}")
        for blocks, t in r["ms_by_blocks_per_sm"].items():
            for v in ("fused_autograd", "fused_l1"):
                print(
                    f"{name:6} {v + '@' + str(blocks):15} {t[v]:8.3f} {r['ms']['gsplat'] / t[v]:9.2f} "
                    f"{'-':>9}  (capacity {t['capacity']})"
                )
        print(f"{name:6} pruned {r['pruned']} entries (capacity {r['capacity']}, max/tile {r['max_per_tile']})")
    print(
        f"max |image err| {results['max_abs_err_image']:.3g} (pixels over 1e-4: {results['pixels_over_1e-4']:.2g}), "
        f"max rel grad err {results['max_rel_err_grad']:.3g}"
    )
    print(f"wrote {args.json}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
