"""The SSIM kernel (bytesplat_ns/ssim.py, cuda/csrc/ssim.h) against pytorch_msssim, splatfacto's SSIM, in float64.

GPU: fresh random image pairs of several sizes (the 11x11 minimum, sizes that are not multiples of the 16x16
block, one channel and three), prediction = target + noise so SSIM sits where training keeps it. Outputs are
poisoned with NaN before each run. Checked: the value within VALUE_ATOL, dSSIM/dpred within GRAD_RTOL norm-wise,
no NaN; and the gradient scaled by the incoming one. CPU: the torch path is pytorch_msssim exactly.
"""

from __future__ import annotations

import pytest
import torch
from pytorch_msssim import ssim as msssim

from bytesplat_ns.ssim import SSIMTerm

VALUE_ATOL = 1e-5
GRAD_RTOL = 1e-4
SIZES = [(11, 11, 3), (16, 16, 3), (37, 23, 3), (64, 48, 1), (203, 157, 3), (400, 400, 3)]
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="the SSIM kernel needs a CUDA GPU")


def image_pair(height: int, width: int, channels: int, seed: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    gt = torch.rand(height, width, channels, generator=gen)
    pred = (gt + 0.2 * torch.randn(height, width, channels, generator=gen)).clamp(0.0, 1.0)
    return gt.to(device), pred.to(device)


def reference(gt: torch.Tensor, pred: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """pytorch_msssim's SSIM and dSSIM/dpred in float64, on the same float32 numbers."""
    leaf = pred.detach().double().requires_grad_(True)
    value = msssim(gt.double().permute(2, 0, 1)[None], leaf.permute(2, 0, 1)[None], data_range=1.0)
    (grad,) = torch.autograd.grad(value, leaf)
    return value.detach(), grad


@gpu
@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_kernel_matches_pytorch_msssim(size):
    from bytesplat_ns.cuda import ops

    gt, pred = image_pair(*size, seed=sum(size), device="cuda")
    leaf = pred.clone().requires_grad_(True)
    value = ops.ssim(gt, leaf, poison=True)
    (grad,) = torch.autograd.grad(value, leaf)
    expected_value, expected_grad = reference(gt, pred)
    assert torch.isfinite(value) and torch.isfinite(grad).all()
    assert abs(value.item() - expected_value.item()) <= VALUE_ATOL
    error = (grad.double() - expected_grad).norm() / expected_grad.norm()
    assert error <= GRAD_RTOL, f"relative gradient error {error:.2e}"


@gpu
def test_gradient_follows_the_incoming_gradient():
    from bytesplat_ns.cuda import ops

    gt, pred = image_pair(50, 70, 3, seed=7, device="cuda")
    leaf = pred.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(ops.ssim(gt, leaf), leaf)
    (scaled,) = torch.autograd.grad(0.2 * (1.0 - ops.ssim(gt, leaf)), leaf)
    torch.testing.assert_close(scaled, -0.2 * grad, rtol=1e-6, atol=1e-9)


@gpu
def test_term_takes_the_kernel_on_cuda_and_torch_for_small_or_off():
    gt, pred = image_pair(32, 32, 3, seed=8, device="cuda")
    assert SSIMTerm(kernel=True).uses_kernel(pred)
    assert not SSIMTerm(kernel=False).uses_kernel(pred)
    assert not SSIMTerm(kernel=True).uses_kernel(pred[:10])
    small = SSIMTerm(kernel=True)(gt[:10], pred[:10])  # pytorch_msssim skips the rows the window does not fit
    assert torch.isfinite(small)


@gpu
def test_kernel_refuses_gradient_to_the_target():
    from bytesplat_ns.cuda import ops

    gt, pred = image_pair(20, 20, 3, seed=9, device="cuda")
    with pytest.raises(ValueError, match="second image only"):
        ops.ssim(gt.requires_grad_(True), pred)


def test_torch_path_is_pytorch_msssim():
    gt, pred = image_pair(40, 30, 3, seed=10, device="cpu")
    term = SSIMTerm(kernel=True)  # on the CPU: pytorch_msssim
    assert not term.uses_kernel(pred)
    leaf = pred.clone().requires_grad_(True)
    value = term(gt, leaf)
    expected_value, expected_grad = reference(gt, pred)
    (grad,) = torch.autograd.grad(value, leaf)
    assert abs(value.item() - expected_value.item()) <= 1e-6
    torch.testing.assert_close(grad.double(), expected_grad, rtol=1e-4, atol=1e-9)


def test_a_missing_build_names_both_fixes(monkeypatch):
    from bytesplat_ns.cuda import ops
    from bytesplat_ns.cuda.build import FusedBuildError

    def no_build(*args, **kwargs):
        raise FusedBuildError("nvcc was not found")

    monkeypatch.setattr(ops, "ssim", no_build)
    monkeypatch.setattr(SSIMTerm, "uses_kernel", lambda self, image: True)
    gt, pred = image_pair(20, 20, 3, seed=11, device="cpu")
    with pytest.raises(FusedBuildError, match="nvcc was not found") as error:
        SSIMTerm(kernel=True)(gt, pred)
    assert "--pipeline.model.ssim-kernel False" in str(error.value)
