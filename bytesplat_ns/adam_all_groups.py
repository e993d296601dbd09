"""Adam over every splat parameter group in one kernel launch (issue #6), visibility-masked on request.

nerfstudio keeps one torch Adam per parameter group (means, features_dc, features_rest, opacities, scales,
quats). torch's fused Adam then takes two launches per group and step (the update and the step count), and its
multi-tensor kernel gives a group's one tensor a block per 64k elements: the six updates took 0.41 ms of GPU
time per step on lego-400 at 47k splats (benchmarks/RESULTS.md, tenth session). On CUDA, `AdamAllGroups` steps
every group in one launch of csrc/adam.cu, with torch's fused arithmetic, on torch's own per-parameter state
(exp_avg, exp_avg_sq, step): checkpoints, densification's state surgery and the non-finite guard's snapshots see
the same optimizers as before. The learning rates the schedulers set are written to a device tensor the kernel
reads (only those that changed), so the launch is recorded once in the step graph (step_graph.py) and replayed.

`visible_only` (--adam-visible-only True): the rows of splats outside this step's view (radius 0) keep their
parameters and moments, as Taming 3DGS's sparse Adam and gsplat's SelectiveAdam do; the step count advances for
all. Off by default: its effect on quality and time is in benchmarks/RESULTS.md.

Elsewhere (the CPU, mixed precision, gradient clipping, an optimizer that is not plain Adam) nerfstudio's
per-group step runs; `ineligible` says why.
"""

from __future__ import annotations

import torch
from nerfstudio.engine.optimizers import Optimizers
from torch import Tensor

from bytesplat_ns.cuda import ops

MAX_GROUPS = 8
"""Parameter groups one launch takes (kMaxAdamGroups in csrc/adam.h)."""


def ineligible(optimizers: Optimizers, device: str, mixed_precision: bool) -> str | None:
    """Why one launch cannot step `optimizers` (None: it can)."""
    opts = list(optimizers.optimizers.values())

    def plain_adam(opt: torch.optim.Optimizer) -> bool:
        if type(opt) is not torch.optim.Adam or len(opt.param_groups) != 1:
            return False
        group = opt.param_groups[0]
        return (
            len(group["params"]) == 1 and group["params"][0].dtype == torch.float32
            and not group["amsgrad"] and not group["maximize"] and group["weight_decay"] == 0
            and not group.get("decoupled_weight_decay", False) and not group["differentiable"]
        )  # fmt: skip

    checks = [
        (not device.startswith("cuda"), "training on the CPU"),
        (mixed_precision, "mixed precision (a gradient scaler)"),
        (not 0 < len(opts) <= MAX_GROUPS, f"{len(opts)} parameter groups (one launch takes 1 to {MAX_GROUPS})"),
        (not all(plain_adam(opt) for opt in opts), "an optimizer other than Adam without weight decay or amsgrad"),
        (any(c["optimizer"].max_norm is not None for c in optimizers.config.values()), "gradient clipping"),
    ]
    return next((why for failed, why in checks if failed), None)


class AdamAllGroups:
    """One Adam launch over `optimizers`' groups, on their torch state. Call `load_learning_rates` once per step
    before `step` (outside a CUDA graph recording: it writes the device tensor the recorded launch reads)."""

    def __init__(self, optimizers: Optimizers, device: torch.device | str, visible_only: bool = False) -> None:
        self.optimizers = optimizers
        self.visible_only = visible_only
        self.lrs = torch.zeros(len(optimizers.optimizers), device=device)  # [G] as the kernel reads them
        self._lr_values: list[float | None] = [None] * len(self.lrs)  # what `lrs` holds (None: not written yet)
        self.blocks_done = torch.zeros(1, dtype=torch.int32, device=device)  # the kernel's block counter

    def describe(self) -> str:
        rows = "the rows of visible splats" if self.visible_only else "every row"
        return f"one launch over {len(self.lrs)} parameter groups, {rows}"

    def load_learning_rates(self) -> None:
        """Write the learning rates the schedulers changed (one small fill each, no host sync)."""
        for index, opt in enumerate(self.optimizers.optimizers.values()):
            lr = opt.param_groups[0]["lr"]
            if lr != self._lr_values[index]:
                self.lrs[index].fill_(lr)
                self._lr_values[index] = lr

    def step(self, radii: Tensor | None = None, skip: Tensor | None = None) -> None:
        """Adam on every group with a gradient (as torch, groups without one are skipped). `radii`: [..., N] of
        this step's render, its zeros the splats out of view (used with visible_only). `skip`: [] bool on the
        device, True (a step the non-finite guard rejected) changes nothing."""
        params, grads, avgs, avg_sqs, steps, betas, eps, used = [], [], [], [], [], [], [], []
        for index, opt in enumerate(self.optimizers.optimizers.values()):
            group = opt.param_groups[0]
            param = group["params"][0]
            if param.grad is None:
                continue
            state = _state(opt, param)
            params.append(param.data)
            grads.append(param.grad)
            avgs.append(state["exp_avg"])
            avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
            betas.append(group["betas"])
            eps.append(group["eps"])
            used.append(index)
        if not params:
            return
        lrs = self.lrs if len(used) == len(self.lrs) else self.lrs[used]
        visible = None
        if self.visible_only and radii is not None:
            visible = (radii.reshape(-1, radii.shape[-1]) > 0).any(dim=0)
        ops.adam_step(params, grads, avgs, avg_sqs, steps, lrs, betas, eps, self.blocks_done, visible, skip)


def _state(opt: torch.optim.Optimizer, param: Tensor) -> dict:
    """`param`'s Adam state as torch's fused Adam makes it (created on a first step, like torch's), its step a
    float32 device tensor (a state loaded from a non-fused Adam's checkpoint holds it on the CPU)."""
    state = opt.state[param]
    if not state:
        state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
        state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
    elif state["step"].device != param.device or state["step"].dtype != torch.float32:
        state["step"] = state["step"].to(device=param.device, dtype=torch.float32)
    return state
