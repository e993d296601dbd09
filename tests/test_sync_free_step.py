"""The training step reads nothing back from the GPU: camera sizes come from the datamanager as Python ints."""

from __future__ import annotations

import pytest

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
