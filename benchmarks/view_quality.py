"""Where a trained run loses held-out quality: each test view's PSNR, the splats' statistics, and the worst views'
renders beside their ground truth, for one or more nerfstudio run folders (splatfacto or bytesplat).

A run far below its peers (e.g. one seed 2 dB under the others) is either every view a little worse or a few views
much worse (a floater in front of those cameras); the per-view list tells which, and the images show it.

    python3 benchmarks/view_quality.py RUN_FOLDER [RUN_FOLDER ...] --out $OUT/views --worst 3

Writes <out>/view_quality.json and <out>/<run name>_view<k>.png (ground truth left, render right). Needs the GPU
the run trained on (or the CPU, slowly). Table last.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import offline_nerfstudio  # noqa: E402,F401  (no downloads)


def quantiles(values: torch.Tensor) -> dict[str, float]:
    q = torch.tensor([0.5, 0.9, 0.99, 1.0])
    return dict(zip(("median", "p90", "p99", "max"), torch.quantile(values.float().cpu(), q).tolist()))


def splat_stats(params: dict[str, torch.Tensor]) -> dict:
    """Count, opacity and size statistics of the splats (sizes in scene units, after exp)."""
    means = params["means"].detach()
    size = params["scales"].detach().exp().amax(dim=-1)
    opacity = params["opacities"].detach().sigmoid().reshape(-1)
    return {
        "splats": int(means.shape[0]),
        "opacity": quantiles(opacity),
        "largest_axis": quantiles(size),
        "distance_from_origin": quantiles(means.norm(dim=-1)),
        "opaque_and_larger_than_0.5": int(((opacity > 0.5) & (size > 0.5)).sum()),
    }


def view_psnrs(folder: Path, out: Path, worst: int) -> dict:
    from nerfstudio.utils.eval_utils import eval_setup
    from PIL import Image

    _, pipeline, _, step = eval_setup(folder / "config.yml", test_mode="test")
    pipeline.eval()
    model = pipeline.model
    psnrs, images = [], []
    with torch.no_grad():
        for camera, batch in pipeline.datamanager.fixed_indices_eval_dataloader:
            outputs = model.get_outputs_for_camera(camera=camera)
            metrics, image_dict = model.get_image_metrics_and_images(outputs, batch)
            psnrs.append(float(metrics["psnr"]))
            images.append((image_dict["img"].clamp(0, 1) * 255).byte().cpu())
    name = "_".join(folder.parts[-3:])
    order = sorted(range(len(psnrs)), key=lambda k: psnrs[k])
    out.mkdir(parents=True, exist_ok=True)
    for k in order[:worst]:
        Image.fromarray(images[k].numpy()).save(out / f"{name}_view{k}.png")
    return {
        "folder": str(folder),
        "step": step,
        "psnr_mean": sum(psnrs) / len(psnrs),
        "psnr_per_view": psnrs,
        "worst_views": order[:worst],
        **splat_stats(dict(model.gauss_params)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", type=Path, nargs="+", help="run folders (holding config.yml)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/view-quality"))
    parser.add_argument("--worst", type=int, default=3, help="save this many worst views' images per run")
    args = parser.parse_args()
    results = [view_psnrs(folder, args.out, args.worst) for folder in args.folders]
    (args.out / "view_quality.json").write_text(json.dumps(results, indent=2))
    print(f"{'run':<48} {'PSNR':>6} {'worst 3 views (PSNR)':<36} {'splats':>7} {'big+opaque':>10}")
    for r in results:
        worst = ", ".join(f"{k} ({r['psnr_per_view'][k]:.1f})" for k in r["worst_views"][:3])
        print(f"{r['folder'][-48:]:<48} {r['psnr_mean']:6.2f} {worst:<36} {r['splats']:7d} "
              f"{r['opaque_and_larger_than_0.5']:10d}")  # fmt: skip


if __name__ == "__main__":
    main()
