"""ByteSplat's datamanager gives the training cameras and images nerfstudio's FullImageDatamanager gives, in the
same order, from its stored one-camera views; what a caller does to a camera does not reach the next one."""

from __future__ import annotations

import dataclasses

import torch
from nerfstudio.data.datamanagers.full_images_datamanager import FullImageDatamanager

from tests.trainer_setup import make_trainer


def _fields(camera) -> dict[str, torch.Tensor]:
    values = {f.name: getattr(camera, f.name) for f in dataclasses.fields(camera)}
    return {name: value for name, value in values.items() if torch.is_tensor(value)}


def test_next_train_matches_nerfstudio_over_several_epochs(tmp_path):
    ours = make_trainer(tmp_path / "ours", steps=1).pipeline.datamanager
    theirs = make_trainer(tmp_path / "theirs", steps=1).pipeline.datamanager  # same scene, same sampling seed
    num_cameras = len(ours.train_dataset)
    seen = []
    for step in range(3 * num_cameras + 1):  # across epoch boundaries (the order is redrawn there)
        camera, batch = ours.next_train(step)
        expected_camera, expected_batch = FullImageDatamanager.next_train(theirs, step)
        assert camera.shape == expected_camera.shape == (1,)
        assert camera.metadata["cam_idx"] == expected_camera.metadata["cam_idx"]
        expected = _fields(expected_camera)
        assert _fields(camera).keys() == expected.keys()
        for name, value in _fields(camera).items():
            torch.testing.assert_close(value, expected[name], rtol=0, atol=0, msg=name)
        assert batch.keys() == expected_batch.keys()
        torch.testing.assert_close(batch["image"], expected_batch["image"], rtol=0, atol=0)
        width, height = camera.metadata["size"]
        assert batch["image"].shape[:2] == (height, width)
        seen.append(camera.metadata["cam_idx"])
    assert sorted(seen[:num_cameras]) == list(range(num_cameras))


def test_a_callers_changes_stay_with_its_camera(tmp_path):
    datamanager = make_trainer(tmp_path, steps=1).pipeline.datamanager
    num_cameras = len(datamanager.train_dataset)
    first, batch = datamanager.next_train(0)
    index, fx = first.metadata["cam_idx"], first.fx.clone()
    first.rescale_output_resolution(0.5)  # reassigns fx, fy, cx, cy, width, height on `first` only
    first.metadata["extra"] = 1
    batch["image"] = None
    for step in range(1, 2 * num_cameras + 1):
        camera, batch = datamanager.next_train(step)
        if camera.metadata["cam_idx"] == index:
            break
    else:
        raise AssertionError(f"camera {index} did not come again within two epochs")
    torch.testing.assert_close(camera.fx, fx, rtol=0, atol=0)
    assert "extra" not in camera.metadata
    assert batch["image"] is not None and datamanager.cached_train[index]["image"] is not None
