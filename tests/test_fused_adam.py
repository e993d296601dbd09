"""bytesplat's optimizers run torch's fused Adam: the same updates as nerfstudio's default Adam."""

from __future__ import annotations

import torch

from bytesplat_method_configs import bytesplat
from bytesplat_ns.fused_adam import FusedAdamOptimizerConfig


def test_bytesplat_builds_fused_adam_for_every_group():
    for name, group in bytesplat.config.optimizers.items():
        optimizer = group["optimizer"].setup([torch.nn.Parameter(torch.zeros(3))])
        assert isinstance(optimizer, torch.optim.Adam), name
        assert optimizer.defaults["fused"] is True, name


def test_fused_adam_matches_the_default_adam_over_steps():
    generator = torch.Generator().manual_seed(0)
    start = torch.randn(64, 3, generator=generator)
    grads = [torch.randn(64, 3, generator=generator) for _ in range(20)]
    params = {}
    for fused in (True, False):
        param = torch.nn.Parameter(start.clone())
        optimizer = FusedAdamOptimizerConfig(lr=0.01, eps=1e-15, fused=fused).setup([param])
        for grad in grads:
            param.grad = grad.clone()
            optimizer.step()
        params[fused] = param.detach()
    torch.testing.assert_close(params[True], params[False], rtol=1e-5, atol=1e-6)
