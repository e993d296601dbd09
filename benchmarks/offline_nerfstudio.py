"""Run a nerfstudio command with no network: LPIPS (whose weights download on construction) is replaced
by a metric that reports NaN, and bytesplat's checkpoint allow-list is registered. Used for the splatfacto
baseline on the GPU machine, which has no network. Usage: python offline_nerfstudio.py ns-train ARGS..."""

from __future__ import annotations

import sys

import torch
import torchmetrics.image.lpip

import bytesplat_ns  # noqa: F401  (registers the numpy types nerfstudio checkpoints hold)


class LpipsNotMeasured(torch.nn.Module):
    def __init__(self, **_: object) -> None:
        super().__init__()

    def forward(self, *_: torch.Tensor) -> torch.Tensor:
        return torch.tensor(float("nan"))


torchmetrics.image.lpip.LearnedPerceptualImagePatchSimilarity = LpipsNotMeasured


def main() -> None:
    tool, sys.argv = sys.argv[1], sys.argv[1:]
    if tool == "ns-train":
        from nerfstudio.scripts.train import entrypoint
    elif tool == "ns-eval":
        from nerfstudio.scripts.eval import entrypoint
    else:
        raise SystemExit(f"offline_nerfstudio.py runs ns-train or ns-eval, not {tool}")
    entrypoint()


if __name__ == "__main__":
    main()
