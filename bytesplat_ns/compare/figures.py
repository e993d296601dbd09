"""The study's pictures: held-out PSNR against training time, and GT | baseline | candidate for views that got worse."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from bytesplat_ns.compare.records import RunRecord

COLOURS = {"baseline": "tab:blue", "candidate": "tab:orange"}
MARKERS = "osD^v<>ph*"
MIN_PANEL_WIDTH = 128
"""Side-by-side panels narrower than this [px] are enlarged by a whole factor."""


def plot_psnr_curves(runs: Sequence[RunRecord], path: Path) -> Path:
    """Held-out PSNR [dB] against training wall time [s], every successful run (colour: method, marker: seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = sorted({r.seed for r in runs})
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    for run in runs:
        if run.status != "ok" or not run.curve:
            continue
        marker = MARKERS[seeds.index(run.seed) % len(MARKERS)]
        ax.plot(
            [p.train_s for p in run.curve],
            [p.psnr for p in run.curve],
            color=COLOURS[run.role],
            marker=marker,
            markersize=4,
            linewidth=1.2,
            label=f"{run.role}: {run.method}, seed {run.seed}",
        )
        if run.role == "baseline" and run.psnr is not None:
            ax.axhline(run.psnr, color=COLOURS["baseline"], linestyle=":", linewidth=0.8)
    ax.set_xlabel("training wall time [s] (held-out evaluations excluded)")
    ax.set_ylabel("held-out PSNR [dB]")
    ax.set_title("Held-out PSNR against training time (dotted: each baseline's final PSNR, the target)")
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7, loc="lower right")
    else:
        ax.text(0.5, 0.5, "no run succeeded", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def side_by_side(images: Sequence[Path], labels: Sequence[str], path: Path) -> Path:
    """The images next to each other (left to right), each under its label, as one PNG. Small images are enlarged
    (nearest neighbour, whole factor) to at least MIN_PANEL_WIDTH pixels, so pixels and labels stay readable."""
    pictures = [Image.open(p).convert("RGB") for p in images]
    scale = max(1, math.ceil(MIN_PANEL_WIDTH / min(p.width for p in pictures)))
    pictures = [p.resize((p.width * scale, p.height * scale), Image.Resampling.NEAREST) for p in pictures]
    loaded = [np.asarray(p) for p in pictures]  # each [H, W, 3] uint8
    height = max(a.shape[0] for a in loaded)
    loaded = [np.pad(a, ((0, height - a.shape[0]), (0, 0), (0, 0))) for a in loaded]
    gap = np.full((height, 4, 3), 255, np.uint8)
    row = np.concatenate([x for a in loaded for x in (a, gap)][:-1], axis=1)
    header = 14
    canvas = Image.new("RGB", (row.shape[1], height + header), "white")
    canvas.paste(Image.fromarray(row), (0, header))
    draw = ImageDraw.Draw(canvas)
    x = 0
    for array, label in zip(loaded, labels):
        while label and draw.textlength(label) > array.shape[1] - 4:
            label = label[:-1]
        draw.text((x + 2, 1), label, fill="black")
        x += array.shape[1] + gap.shape[1]
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(path)
    return path
