"""The training step reads nothing back from the GPU: camera sizes come from the datamanager as Python ints."""

from __future__ import annotations

import pytest
import torch

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
