"""LPIPS without downloads: built only when torchvision's AlexNet weights are already on disk."""

from __future__ import annotations

from pathlib import Path

import torch
from nerfstudio.utils.rich_utils import CONSOLE


def alexnet_weights_path() -> Path:
    from torchvision.models import AlexNet_Weights

    return Path(torch.hub.get_dir()) / "checkpoints" / Path(AlexNet_Weights.IMAGENET1K_V1.url).name


def lpips_if_weights_on_disk() -> torch.nn.Module | None:
    """torchmetrics' LPIPS (AlexNet) when its weights need no download; otherwise None, said once."""
    path = alexnet_weights_path()
    if not path.exists():
        CONSOLE.print(f"LPIPS skipped: AlexNet weights are not at {path} (bytesplat never downloads).")
        return None
    from torchmetrics.image.lpip import LearnedPerceptualImagePatchSimilarity

    return LearnedPerceptualImagePatchSimilarity(normalize=True)
