"""--pipeline.model.random-background-in-training: random colours behind training views, the configured colour
behind everything else, and a clear error for images without alpha (CPU, the built-in scene's RGBA images)."""

from __future__ import annotations

import pytest
import torch

from tests.trainer_setup import make_trainer

WHITE = torch.ones(3)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    trainer = make_trainer(
        tmp_path_factory.mktemp("random-background"), 3, background_color="white", random_background_in_training=True
    )
    trainer.pipeline.model.step_cb(trainer.optimizers, step=0)  # what the trainer's first step does
    return trainer.pipeline.model, trainer.pipeline.datamanager


def test_training_draws_a_new_colour_and_evaluation_keeps_white(model):
    model, _ = model
    model.train()
    drawn = [model._get_background_color() for _ in range(3)]
    assert all(((0 <= c) & (c <= 1)).all() and not torch.equal(c, WHITE) for c in drawn)
    assert not torch.equal(drawn[0], drawn[1]) and not torch.equal(drawn[1], drawn[2])
    model.eval()
    assert torch.equal(model._get_background_color(), WHITE)
    model.train()


def test_the_ground_truth_goes_over_the_colour_the_render_used(model):
    model, datamanager = model
    model.train()
    camera, batch = datamanager.next_train(0)
    assert batch["image"].shape[-1] == 4  # the built-in scene keeps its alpha channel
    outputs = model.get_outputs(camera, batch)
    model.get_loss_dict(outputs, batch, model.get_metrics_dict(outputs, batch))
    target, background = batch["bytesplat_target"], outputs["background"]
    alpha = batch["image"][..., 3].float() / 255.0
    empty = alpha == 0
    assert empty.any() and not torch.equal(background, WHITE)
    assert torch.allclose(target[empty], background.expand_as(target[empty]))


def test_images_without_alpha_fail_with_the_fix(model):
    model, datamanager = model
    model.train()
    camera, batch = datamanager.next_train(1)
    batch = {**batch, "image": batch["image"][..., :3]}
    outputs = model.get_outputs(camera, batch)
    with pytest.raises(ValueError, match="--alpha-color None"):
        model.get_loss_dict(outputs, batch, model.get_metrics_dict(outputs, batch))
