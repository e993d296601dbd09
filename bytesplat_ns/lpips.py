"""LPIPS without downloads: built only when torchvision's AlexNet weights are already on disk, and a stand-in
for methods (splatfacto) that would build it anyway."""

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


class LpipsNotMeasured(torch.nn.Module):
    """Stands in for torchmetrics' LPIPS when AlexNet's weights are not on disk: building the real one downloads."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()

    def forward(self, *args, **kwargs) -> torch.Tensor:
        return torch.tensor(float("nan"))


def stand_in_lpips_unless_on_disk() -> bool:
    """Replace torchmetrics' LPIPS class by `LpipsNotMeasured` when its weights would be downloaded (before any
    model is built); True if replaced."""
    if alexnet_weights_path().exists():
        return False
    import torchmetrics.image
    import torchmetrics.image.lpip

    torchmetrics.image.lpip.LearnedPerceptualImagePatchSimilarity = LpipsNotMeasured
    torchmetrics.image.LearnedPerceptualImagePatchSimilarity = LpipsNotMeasured
    return True
