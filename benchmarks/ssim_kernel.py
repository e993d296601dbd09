"""SSIM term benchmark (H200): splatfacto's 0.2 * (1 - SSIM) loss term, forward and backward w.r.t. the
prediction, by bytesplat's kernels (bytesplat_ns/ssim.py "kernel") against pytorch_msssim ("torch"), at lego's
800x800 and at 1920x1080. Per implementation and size:
  gpu_ms     median GPU time of one forward+backward (CUDA events around it, after a synchronize)
  host_ms    host time to issue one forward+backward: the mean wall time of 200 back-to-back calls with no
             synchronize in between, divided by 200 (the GPU keeps up at these sizes: the host is the limit)
  launches   kernel launches per forward+backward (torch profiler: cudaLaunchKernel and variants)
  max_abs_err_value, max_rel_err_grad: the kernel against pytorch_msssim in float32, same images
Writes --json (benchmarks/results/ssim_kernel.json) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bytesplat_ns.ssim import SSIMTerm  # noqa: E402
from bytesplat_ns.step_profile import LAUNCHES  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from fused_kernel import median_ms  # noqa: E402

SIZES = {"lego-800x800": (800, 800), "1920x1080": (1080, 1920)}
ISSUE_CALLS = 200


def images(height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(0)
    gt = torch.rand(height, width, 3, generator=g, device="cuda")
    pred = (gt + 0.1 * torch.randn(height, width, 3, generator=g, device="cuda")).clamp(0, 1)
    return gt, pred.requires_grad_(True)


def step(term: SSIMTerm, gt: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
    loss = 0.2 * (1.0 - term(gt, pred))
    (grad,) = torch.autograd.grad(loss, pred)
    return grad


def host_ms(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(ISSUE_CALLS):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return 1000.0 * elapsed / ISSUE_CALLS


def launches(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if e.key in LAUNCHES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "ssim_kernel.json")
    args = parser.parse_args()
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "sizes": {}}
    for name, (height, width) in SIZES.items():
        gt, pred = images(height, width)
        row = {}
        grads = {}
        for impl, term in (("torch", SSIMTerm(kernel=False)), ("kernel", SSIMTerm(kernel=True))):
            fn = lambda term=term, gt=gt, pred=pred: step(term, gt, pred)  # noqa: E731
            for _ in range(5):
                fn()
            grads[impl] = fn()
            row[impl] = {"gpu_ms": median_ms(fn, warmup=0, iters=30), "host_ms": host_ms(fn), "launches": launches(fn)}
        value_err = abs(SSIMTerm(kernel=True)(gt, pred).item() - SSIMTerm(kernel=False)(gt, pred).item())
        grad_err = ((grads["kernel"] - grads["torch"]).norm() / grads["torch"].norm()).item()
        row.update(max_abs_err_value=value_err, max_rel_err_grad=grad_err)
        results["sizes"][name] = row
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{'size':<14} {'impl':<7} {'gpu ms':>8} {'host ms':>8} {'launches':>9}")
    for name, row in results["sizes"].items():
        for impl in ("torch", "kernel"):
            r = row[impl]
            print(f"{name:<14} {impl:<7} {r['gpu_ms']:8.3f} {r['host_ms']:8.3f} {r['launches']:9d}")
        print(f"{name:<14} value err {row['max_abs_err_value']:.1e}, grad rel err {row['max_rel_err_grad']:.1e}")


if __name__ == "__main__":
    main()
