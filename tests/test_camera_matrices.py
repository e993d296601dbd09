"""The training cameras' stored matrices (camera_matrices.py) are the ones the model would build from each camera,
at every downscale splatfacto uses; the stacked images are the cached ones, which become views of the stack; a
training render from the stored matrices is the render from the camera; and the step graph's inputs read the
camera they are given."""

from __future__ import annotations

import copy

import pytest
import torch

from bytesplat_ns.camera_matrices import (
    INTRINSICS,
    VIEWMAT,
    CameraStack,
    IntrinsicsScale,
    intrinsics_matrix,
    stored_matrices,
    viewmat_from_camera_to_world,
)
from tests.trainer_setup import make_trainer


def _training_cameras(datamanager) -> list:
    """Every training camera as next_train gives it, in camera order."""
    cameras = {}
    for step in range(len(datamanager.train_dataset)):
        camera, _ = datamanager.next_train(step)
        cameras[camera.metadata["cam_idx"]] = camera
    return [cameras[index] for index in sorted(cameras)]


@pytest.mark.parametrize("focal_dtype", [torch.float32, torch.float64])  # blender scenes hold float64 focals
def test_stored_matrices_are_the_cameras_at_every_downscale(tmp_path, focal_dtype):
    datamanager = make_trainer(tmp_path, steps=1).pipeline.datamanager
    cameras = datamanager.train_cameras
    cameras.fx, cameras.fy = cameras.fx.to(focal_dtype) * 1.37, cameras.fy.to(focal_dtype) * 0.91  # not round
    scale = IntrinsicsScale()
    for index, camera in enumerate(_training_cameras(datamanager)):
        assert camera.metadata[VIEWMAT].shape == (1, 16) and camera.metadata[INTRINSICS].shape == (1, 9)
        viewmat, full = stored_matrices(camera)
        assert torch.equal(viewmat, viewmat_from_camera_to_world(camera.camera_to_worlds[0]))
        for downscale in (1, 2, 4, 8):
            assert torch.equal(scale(full, downscale), intrinsics_matrix(camera, downscale)), (index, downscale)


def test_the_stack_holds_the_cached_images_and_the_cache_views_it(tmp_path):
    datamanager = make_trainer(tmp_path, steps=1).pipeline.datamanager
    before = [entry["image"].clone() for entry in datamanager.cached_train]
    stack = datamanager.camera_stack
    assert stack.images is not None and stack.images.shape[0] == len(before)
    for index, image in enumerate(before):
        cached = datamanager.cached_train[index]["image"]
        assert cached.data_ptr() == stack.images[stack.rows[index]].data_ptr()  # a view: not held twice
        assert torch.equal(cached, image)
    camera, batch = datamanager.next_train(0)
    index = camera.metadata["cam_idx"]
    assert torch.equal(batch["image"], before[index])
    assert batch["image"].data_ptr() == stack.images[stack.rows[index]].data_ptr()


def test_images_of_different_shapes_are_not_stacked(tmp_path):
    datamanager = make_trainer(tmp_path, steps=1).pipeline.datamanager
    cached = [dict(entry) for entry in datamanager.cached_train]
    cached[1]["image"] = cached[1]["image"][:-1]  # one image a row shorter
    kept = [entry["image"] for entry in cached]
    stack = CameraStack.build(datamanager.train_cameras, cached, list(range(len(cached))), "cpu")
    assert stack.images is None
    assert all(entry["image"] is image for entry, image in zip(cached, kept))  # the cache is left as it was
    assert stack.viewmats.shape == (len(cached), 16) and stack.intrinsics.shape == (len(cached), 9)


def test_a_stack_of_some_cameras_indexes_them_by_camera(tmp_path):
    """Several ranks: a rank stacks its own shard (the others' images are not cached there)."""
    datamanager = make_trainer(tmp_path, steps=1).pipeline.datamanager
    shard = [4, 1]
    cached = [dict(entry) if index in shard else None for index, entry in enumerate(datamanager.cached_train)]
    stack = CameraStack.build(datamanager.train_cameras, cached, shard, "cpu")
    assert stack.rows == {4: 0, 1: 1} and stack.images.shape[0] == 2
    for index in shard:
        camera = datamanager.train_cameras[index : index + 1]
        assert torch.equal(stack.metadata(index)[INTRINSICS].view(3, 3), intrinsics_matrix(camera))
        assert torch.equal(stack.images[stack.rows[index]], datamanager.cached_train[index]["image"])


@pytest.mark.parametrize("num_downscales", [0, 1])
def test_a_training_render_from_the_stored_matrices_is_the_render_from_the_camera(tmp_path, num_downscales):
    options = {"num_downscales": num_downscales, "resolution_schedule": 1000, "background_color": "white"}
    trainer = make_trainer(tmp_path, steps=1, **options)  # white: a random background differs per render
    model = trainer.pipeline.model
    model.step_cb(trainer.optimizers, step=0)
    camera, _ = trainer.pipeline.datamanager.next_train(0)
    assert stored_matrices(camera) is not None
    built = copy.copy(camera)
    built.metadata = {k: v for k, v in camera.metadata.items() if k not in (VIEWMAT, INTRINSICS)}
    assert model._stored_matrices(built) is None
    stored_rgb, built_rgb = model(camera)["rgb"], model(built)["rgb"]
    assert torch.equal(stored_rgb, built_rgb)
    model.eval()  # evaluation and the viewer build the matrices from the camera
    assert model._stored_matrices(camera) is None


def test_the_graph_inputs_read_the_camera_they_are_given(tmp_path):
    """The step graph's inputs (recorded with one camera) gather another camera's matrices and image once its
    index is loaded; run here without a graph (the gathers are ordinary ops)."""
    from bytesplat_ns.step_graph import _GraphInputs

    datamanager = make_trainer(tmp_path, steps=1).pipeline.datamanager
    (first, first_batch), (second, second_batch) = datamanager.next_train(0), datamanager.next_train(1)
    assert first.metadata["cam_idx"] != second.metadata["cam_idx"]
    inputs = _GraphInputs(first, first_batch, datamanager.camera_stack)
    assert "cam_idx" not in inputs.camera.metadata  # the recorded camera's index must not be read later
    for camera, batch in ((second, second_batch), (first, first_batch)):
        inputs.load(camera, batch)
        graph_camera, graph_batch = inputs.gathered()
        for key in (VIEWMAT, INTRINSICS):
            assert torch.equal(graph_camera.metadata[key], camera.metadata[key]), key
        assert torch.equal(graph_batch["image"], batch["image"])
        assert graph_camera.metadata["size"] == camera.metadata["size"]
