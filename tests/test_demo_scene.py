"""Tests for the procedural demo scene (bytesplat_ns.demo_scene); small sizes, CPU only."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from plyfile import PlyData

from bytesplat_ns.demo_scene import ROOM, DemoSceneConfig, generate_demo_scene, main

WIDTH = 32
HEIGHT = 24  # deliberately not equal to WIDTH
NUM_TRAIN = 6
NUM_EVAL = 2
NUM_POINTS = 300
TINY = DemoSceneConfig(width=WIDTH, height=HEIGHT, num_train=NUM_TRAIN, num_eval=NUM_EVAL, num_points=NUM_POINTS)
SPLITS = ("train", "val", "test")


ROOM_VIEW_SHARE = 0.6
"""A room view sees less than this share of the room's point cloud, on average."""


@pytest.fixture(scope="module", params=["still_life", "room"])
def layout(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def scene_dir(layout: str, request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(f"{layout}_dir")


@pytest.fixture(scope="module")
def still_life_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_demo_scene(tmp_path_factory.mktemp("still_life") / "scene", TINY)


@pytest.fixture(scope="module")
def room_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_demo_scene(tmp_path_factory.mktemp("room") / "scene", dataclasses.replace(TINY, layout="room"))


def _all_files(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


PARSERS = ("nerfstudio-data", "bytesplat-data")


def _parse(scene_dir: Path, split: str, parser: str):
    """`parser`: nerfstudio's own (reads the point cloud with open3d) or bytesplat's (plyfile, what ns-train
    bytesplat uses)."""
    if parser == "nerfstudio-data":
        pytest.importorskip("open3d", reason="nerfstudio's own parser reads the point cloud with open3d")
        from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig as Config
    else:
        from bytesplat_ns.dataparser import ByteSplatDataParserConfig as Config
    return Config(data=scene_dir, load_3D_points=True).setup().get_dataparser_outputs(split)


def test_layout(scene_dir: Path) -> None:
    meta = json.loads((scene_dir / "transforms.json").read_text())
    assert meta["camera_model"] == "OPENCV"
    assert (meta["w"], meta["h"]) == (WIDTH, HEIGHT)
    assert (meta["cx"], meta["cy"]) == (WIDTH / 2, HEIGHT / 2)
    assert len(meta["frames"]) == NUM_TRAIN + NUM_EVAL
    assert len(meta["train_filenames"]) == NUM_TRAIN
    assert meta["val_filenames"] == meta["test_filenames"]
    assert len(meta["val_filenames"]) == NUM_EVAL
    assert (scene_dir / meta["ply_file_path"]).is_file()
    for frame in meta["frames"]:
        assert (scene_dir / frame["file_path"]).is_file()
        c2w = np.array(frame["transform_matrix"])
        assert c2w.shape == (4, 4)
        np.testing.assert_allclose(c2w[:3, :3] @ c2w[:3, :3].T, np.eye(3), atol=1e-9)
        np.testing.assert_allclose(c2w[3], [0.0, 0.0, 0.0, 1.0])


def test_deterministic(scene_dir: Path, layout: str, tmp_path: Path) -> None:
    config = dataclasses.replace(TINY, layout=layout)
    again = _all_files(generate_demo_scene(tmp_path / "again", config))
    assert again == _all_files(scene_dir)
    other_seed = dataclasses.replace(config, seed=TINY.seed + 1)
    different = _all_files(generate_demo_scene(tmp_path / "other", other_seed))
    assert different["transforms.json"] != again["transforms.json"]


def test_workers_write_the_same_files(room_dir: Path, tmp_path: Path) -> None:
    config = dataclasses.replace(TINY, layout="room")
    assert _all_files(generate_demo_scene(tmp_path / "two", config, workers=2)) == _all_files(room_dir)


def test_workers_that_cannot_start_name_the_fix(tmp_path: Path) -> None:
    """A script read from stdin cannot be re-imported by a spawned process: the error says what to do."""
    script = (
        "from bytesplat_ns.demo_scene import DemoSceneConfig, generate_demo_scene\n"
        f"generate_demo_scene({str(tmp_path / 'scene')!r}, DemoSceneConfig(width=8, height=6, num_train=2, "
        "num_eval=1), workers=2)\n"
    )
    done = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "if __name__ == '__main__':" in done.stderr and "fewer workers" in done.stderr, done.stderr[-2000:]


def test_room_views_are_opaque_and_each_sees_a_part(room_dir: Path) -> None:
    for path in sorted((room_dir / "images").glob("*.png")):
        assert (np.asarray(Image.open(path))[..., 3] == 255).all(), f"{path.name}: the room leaves no pixel empty"
    meta = json.loads((room_dir / "transforms.json").read_text())
    c2w = np.array([frame["transform_matrix"] for frame in meta["frames"]])  # [N, 4, 4]
    _, lo, hi = ROOM
    assert ((c2w[:, :3, 3] > lo) & (c2w[:, :3, 3] < hi)).all(), "a camera stands outside the room"
    vertices = PlyData.read(room_dir / meta["ply_file_path"])["vertex"]
    xyz = np.stack([vertices[axis] for axis in "xyz"], axis=1).astype(np.float64)  # [P, 3], the cameras' frame
    shares = []
    for pose in c2w:
        local = (xyz - pose[:3, 3]) @ pose[:3, :3]  # [P, 3], camera looking down -z
        depth = -local[:, 2]
        u = meta["fl_x"] * local[:, 0] / np.maximum(depth, 1e-9)
        v = meta["fl_y"] * local[:, 1] / np.maximum(depth, 1e-9)
        seen = (depth > 0) & (np.abs(u) < meta["w"] / 2) & (np.abs(v) < meta["h"] / 2)
        shares.append(seen.mean())
    assert 0.0 < np.mean(shares) < ROOM_VIEW_SHARE, shares
    assert min(shares) > 0.0, "a view sees none of the point cloud"


def test_images_are_rgba_with_coverage(scene_dir: Path, layout: str) -> None:
    if layout == "room":
        pytest.skip("the room layout has no background (test_room_views_are_opaque_and_each_sees_a_part)")
    for path in sorted((scene_dir / "images").glob("*.png")):
        image = Image.open(path)
        assert image.mode == "RGBA"
        assert image.size == (WIDTH, HEIGHT)
        alpha = np.asarray(image)[..., 3]  # [H, W]
        assert (alpha == 0).any(), f"{path.name} has no transparent background"
        assert (alpha == 255).any(), f"{path.name} has no opaque object pixels"


@pytest.mark.parametrize("parser", PARSERS)
def test_parsers_load_splits(scene_dir: Path, parser: str) -> None:
    outputs = {split: _parse(scene_dir, split, parser) for split in SPLITS}
    expected = {"train": NUM_TRAIN, "val": NUM_EVAL, "test": NUM_EVAL}
    for split, out in outputs.items():
        assert len(out.image_filenames) == expected[split]
        assert out.cameras.shape == (expected[split],)
        assert (out.cameras.width == WIDTH).all() and (out.cameras.height == HEIGHT).all()
        for filename in out.image_filenames:
            assert Image.open(filename).size == (WIDTH, HEIGHT)
    train_files = set(outputs["train"].image_filenames)
    eval_files = set(outputs["val"].image_filenames)
    assert eval_files == set(outputs["test"].image_filenames)
    assert not train_files & eval_files
    # Held-out cameras must not sit where a training camera is.
    train_origins = outputs["train"].cameras.camera_to_worlds[:, :3, 3]  # [T, 3]
    eval_origins = outputs["val"].cameras.camera_to_worlds[:, :3, 3]  # [E, 3]
    assert float((eval_origins[:, None] - train_origins[None]).norm(dim=-1).min()) > 1e-3


@pytest.mark.parametrize("parser", PARSERS)
def test_point_cloud(scene_dir: Path, layout: str, parser: str) -> None:
    out = _parse(scene_dir, "train", parser)
    xyz, rgb = out.metadata["points3D_xyz"], out.metadata["points3D_rgb"]
    assert tuple(xyz.shape) == (NUM_POINTS, 3)
    assert tuple(rgb.shape) == (NUM_POINTS, 3)
    assert str(rgb.dtype) == "torch.uint8"
    assert int(rgb.max()) > 0, "point colours are all black"
    assert int(rgb.min()) < 255, "point colours are all white"
    if layout == "still_life":  # the room's walls lie beyond its cameras, so beyond the scene box
        aabb = out.scene_box.aabb  # [2, 3]
        assert bool(((xyz >= aabb[0]) & (xyz <= aabb[1])).all()), "points fall outside the scene box"


def test_both_parsers_read_the_same_points(scene_dir: Path) -> None:
    ours, theirs = (_parse(scene_dir, "train", parser).metadata for parser in ("bytesplat-data", "nerfstudio-data"))
    assert torch.allclose(ours["points3D_xyz"], theirs["points3D_xyz"], atol=1e-6)
    assert torch.equal(ours["points3D_rgb"], theirs["points3D_rgb"])


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "cli"
    main(["--output", str(out), "--width", "20", "--height", "16", "--num-train", "3", "--num-eval", "1"])
    meta = json.loads((out / "transforms.json").read_text())
    assert (meta["w"], meta["h"], len(meta["frames"])) == (20, 16, 4)
    assert str(out.resolve()) in capsys.readouterr().out


def test_cli_room_layout(tmp_path: Path) -> None:
    out = tmp_path / "cli-room"
    main(["--output", str(out), "--width", "20", "--height", "16", "--num-train", "3", "--num-eval", "1",
          "--layout", "room", "--workers", "2"])  # fmt: skip
    image = np.asarray(Image.open(out / "images" / "frame_00000.png"))  # [H, W, 4]
    assert image.shape == (16, 20, 4) and (image[..., 3] == 255).all()


def test_rejects_empty_config(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        generate_demo_scene(tmp_path / "bad", DemoSceneConfig(num_eval=0))
    with pytest.raises(ValueError, match="layout"):
        generate_demo_scene(tmp_path / "bad", DemoSceneConfig(layout="street"))
