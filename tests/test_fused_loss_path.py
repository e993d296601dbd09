"""The model's fused loss path: when a training step takes it, and (GPU) that it trains as autograd would."""

from __future__ import annotations

import functools
import importlib

import pytest
import torch

from tests.trainer_setup import cpu_config, make_trainer, small_scene

LOSS_RTOL = 1e-4
GRAD_RTOL = 1e-3
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused renderer needs a CUDA GPU")


def test_fused_loss_path_is_taken_only_where_it_applies(tmp_path):
    model = make_trainer(tmp_path, steps=1).pipeline.model
    batch = {"image": torch.zeros(4, 4, 3)}
    assert not model.uses_fused_loss(batch)  # the torch renderer
    model.config.renderer = "fused"
    assert model.uses_fused_loss(batch)
    assert not model.uses_fused_loss({**batch, "mask": torch.ones(4, 4, 1)})  # masks: autograd
    model.eval()
    assert not model.uses_fused_loss(batch)  # evaluation renders, never forms a loss
    model.train()
    for name in ("use_bilateral_grid", "output_depth_during_training"):
        setattr(model.config, name, True)
        assert not model.uses_fused_loss(batch), name
        setattr(model.config, name, False)
    model.config.fused_loss = False
    assert not model.uses_fused_loss(batch)


def test_auto_is_the_fused_renderer_on_cuda_and_torch_on_cpu(monkeypatch):
    entry = importlib.import_module("bytesplat_ns.render.rasterize")  # the module (the package exports the function)
    monkeypatch.setattr(entry, "gsplat_available", lambda: True)
    assert entry.resolve_backend("auto", torch.device("cuda", 0)) == "fused"
    assert entry.resolve_backend("auto", torch.device("cpu")) == "torch"
    monkeypatch.setattr(entry, "gsplat_available", lambda: False)  # fused projects with gsplat's kernels
    assert entry.resolve_backend("auto", torch.device("cuda", 0)) == "torch"


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@gpu
def test_fused_loss_step_trains_as_autograd_does(tmp_path):
    """One training step of the model with the fused renderer: the fused loss path gives the loss, every splat
    gradient and the densification statistic (absgrad) of autograd through the rendered image."""
    config = cpu_config(small_scene(tmp_path), tmp_path / "out", 1, "fused")
    config.machine.device_type = "cuda"
    config.pipeline.model.renderer = "fused"
    config.pipeline.model.background_color = "white"  # a random one would differ between the two renders
    trainer = config.setup(local_rank=0, world_size=1)
    trainer.setup()
    pipeline, model = trainer.pipeline, trainer.pipeline.model
    model.step_cb(trainer.optimizers, step=0)
    with torch.no_grad():  # anisotropic splats: the initial ones are round, so rotations get no real gradient
        torch.manual_seed(0)
        model.gauss_params["scales"] += 0.5 * torch.randn_like(model.gauss_params["scales"])
    camera, batch = pipeline.datamanager.next_train(0)
    results = {}
    for fused in (True, False):
        model.config.fused_loss = fused
        trainer.optimizers.zero_grad_all()
        outputs = model.get_outputs(camera, batch=dict(batch))
        assert ("fused_loss" in outputs) == fused
        loss = functools.reduce(torch.add, model.get_loss_dict(outputs, dict(batch)).values())
        loss.backward()
        grads = {name: p.grad.clone() for name, p in model.gauss_params.items()}
        results[fused] = (loss.detach(), grads, model.info["means2d"].absgrad.clone())
    (loss_f, grads_f, abs_f), (loss_a, grads_a, abs_a) = results[True], results[False]
    assert abs(float(loss_f - loss_a)) <= LOSS_RTOL * abs(float(loss_a))
    for name in grads_a:
        assert torch.isfinite(grads_f[name]).all(), name
        assert _relative(grads_f[name], grads_a[name]) <= GRAD_RTOL, name
    assert _relative(abs_f, abs_a) <= GRAD_RTOL
