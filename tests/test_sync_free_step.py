"""The training step reads nothing back from the GPU: camera sizes come from the datamanager as Python ints; loss,
metrics and intrinsics are splatfacto's, computed where the tensors are."""

from __future__ import annotations

import copy

import pytest
import torch
from nerfstudio.models.splatfacto import SplatfactoModel

from bytesplat_ns.camera_matrices import intrinsics_matrix
from tests.trainer_setup import make_trainer


@pytest.mark.parametrize("num_downscales", [0, 1])
def test_training_cameras_carry_their_size_and_the_render_matches_the_image(tmp_path, num_downscales):
    trainer = make_trainer(tmp_path, steps=1, num_downscales=num_downscales, resolution_schedule=1000)
    pipeline = trainer.pipeline
    for step in range(3):
        camera, batch = pipeline.datamanager.next_train(step)
        width, height = camera.metadata["size"]
        assert (width, height) == (int(camera.width.item()), int(camera.height.item()))
        assert batch["image"].shape[:2] == (height, width)
    pipeline.model.step_cb(trainer.optimizers, step=0)  # what the step's first callback does
    _, loss_dict, _ = pipeline.get_train_loss_dict(step=0)  # the render and the (downscaled) image must agree
    assert pipeline.model.last_size == (height // 2**num_downscales, width // 2**num_downscales)
    assert all(v.isfinite() for v in loss_dict.values())


def test_pruned_count_is_a_training_metric_only_when_a_backend_reports_it(tmp_path):
    trainer = make_trainer(tmp_path, steps=1)
    pipeline = trainer.pipeline
    pipeline.model.step_cb(trainer.optimizers, step=0)
    _, _, metrics = pipeline.get_train_loss_dict(step=0)
    assert "pruned_tile_entries" not in metrics  # the torch renderer prunes nothing
    camera, batch = pipeline.datamanager.next_train(1)
    outputs = pipeline.model(camera)
    pipeline.model.pruned = torch.tensor([7], dtype=torch.int32)  # what the fused renderer reports
    assert int(pipeline.model.get_metrics_dict(outputs, batch)["pruned_tile_entries"]) == 7


@pytest.mark.parametrize("num_downscales", [0, 1])
def test_loss_metrics_and_intrinsics_match_splatfacto(tmp_path, num_downscales):
    """The model's sync-free loss, metrics and intrinsics give splatfacto's values."""
    trainer = make_trainer(tmp_path, steps=1, num_downscales=num_downscales, resolution_schedule=1000)
    pipeline = trainer.pipeline
    model = pipeline.model
    model.step_cb(trainer.optimizers, step=0)
    camera, batch = pipeline.datamanager.next_train(0)
    downscale = model._get_downscale_factor()
    scaled = copy.deepcopy(camera)
    scaled.rescale_output_resolution(1 / downscale)
    assert torch.equal(intrinsics_matrix(camera, downscale), scaled.get_intrinsics_matrices()[0])
    blender = copy.deepcopy(camera)  # blender scenes hold fx, fy as float64; intrinsics stay float32 as nerfstudio's
    blender.fx, blender.fy = blender.fx.double(), blender.fy.double()
    scaled.fx, scaled.fy = scaled.fx.double(), scaled.fy.double()
    assert torch.equal(intrinsics_matrix(blender, downscale), scaled.get_intrinsics_matrices()[0])
    outputs = model(camera)
    ours = model.get_loss_dict(outputs, dict(batch), model.get_metrics_dict(outputs, dict(batch)))
    theirs = SplatfactoModel.get_loss_dict(model, outputs, dict(batch))
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.allclose(ours[name], theirs[name], rtol=1e-6, atol=1e-7), name
    psnr = model.get_metrics_dict(outputs, dict(batch))["psnr"]
    assert torch.allclose(psnr, SplatfactoModel.get_metrics_dict(model, outputs, dict(batch))["psnr"], rtol=1e-5)
