"""Splatfacto's SSIM term: pytorch_msssim's ssim(data_range=1, 11x11 Gaussian window) of two [H, W, 3] images,
differentiable w.r.t. the prediction, from one of two implementations with the same value and gradient:

  * kernel: bytesplat's CUDA kernels (cuda/csrc/ssim.h), one launch forward and one backward;
  * torch: pytorch_msssim, as splatfacto (separable convolutions of five images and the element-wise terms:
    tens of launches forward and backward, each costing host time in a step that is bound by the host).

tests/test_ssim.py holds the kernel to pytorch_msssim in float64 (value and gradient, fresh random images).
Images smaller than the window take the torch path (pytorch_msssim skips the axes the window does not fit).
"""

from __future__ import annotations

import torch
from pytorch_msssim import SSIM
from torch import Tensor

from bytesplat_ns.cuda import ops
from bytesplat_ns.cuda.build import FusedBuildError

WINDOW = 11


class SSIMTerm:
    """SSIM(gt, pred) of [H, W, 3] images -> [], by the kernel on CUDA when `kernel` is set, else pytorch_msssim."""

    def __init__(self, kernel: bool = True) -> None:
        self.kernel = kernel
        self.module = SSIM(data_range=1.0, size_average=True, channel=3)

    def uses_kernel(self, image: Tensor) -> bool:
        return self.kernel and image.is_cuda and image.dtype == torch.float32 and min(image.shape[:2]) >= WINDOW

    def __call__(self, gt: Tensor, pred: Tensor) -> Tensor:
        if self.uses_kernel(pred):
            try:
                return ops.ssim(gt.detach(), pred)
            except FusedBuildError as error:
                raise FusedBuildError(f"{error}\nOr use pytorch_msssim: --pipeline.model.ssim-kernel False.") from error
        if self.module.win.device != pred.device:  # a plain attribute that module.to() leaves on the CPU: move once
            self.module.win = self.module.win.to(pred.device)
        return self.module(gt.permute(2, 0, 1)[None], pred.permute(2, 0, 1)[None])
