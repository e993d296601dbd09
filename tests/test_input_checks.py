"""Bad scenes fail before training with a short message naming the problem and the fix."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bytesplat_ns.demo_scene import DemoSceneConfig, generate_demo_scene
from bytesplat_ns.input_checks import BadInputError, check_data_path, check_dataparser_outputs, check_transforms_json
from tests.nerfstudio_cli import ns

SCENE = DemoSceneConfig(width=32, height=24, num_train=4, num_eval=2, num_points=200, seed=5)


@pytest.fixture()
def scene(tmp_path) -> Path:
    return generate_demo_scene(tmp_path / "scene", SCENE)


def edit_transforms(scene: Path, edit) -> None:
    path = scene / "transforms.json"
    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))


def first_image(scene: Path) -> Path:
    return scene / json.loads((scene / "transforms.json").read_text())["frames"][0]["file_path"]


def parse(scene: Path, split: str = "train"):
    from bytesplat_ns.dataparser import ByteSplatDataParserConfig

    return ByteSplatDataParserConfig(data=scene).setup().get_dataparser_outputs(split)


def test_missing_and_empty_data(tmp_path):
    with pytest.raises(BadInputError, match="does not exist"):
        check_data_path(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInputError, match="empty folder"):
        check_data_path(tmp_path / "empty")


def test_unrecognised_format(tmp_path):
    (tmp_path / "notes.txt").write_text("not a scene")
    with pytest.raises(BadInputError, match="no transforms.json"):
        check_transforms_json(tmp_path)


def test_missing_image(scene):
    first_image(scene).unlink()
    with pytest.raises(BadInputError, match="does not exist"):
        check_transforms_json(scene)


def test_truncated_image(scene):
    image = first_image(scene)
    image.write_bytes(image.read_bytes()[: image.stat().st_size // 2])
    with pytest.raises(BadInputError, match="cannot be read"):
        check_dataparser_outputs(parse(scene), "train")


def test_size_disagrees_with_intrinsics(scene):
    edit_transforms(scene, lambda meta: meta.update(w=SCENE.width * 2))
    with pytest.raises(BadInputError, match="intrinsics say"):
        check_dataparser_outputs(parse(scene), "train")


def test_single_image(scene):
    edit_transforms(scene, lambda meta: meta.update(frames=meta["frames"][:1]))
    with pytest.raises(BadInputError, match="single image"):
        check_transforms_json(scene)


def test_nan_pose(scene):
    def poison(meta):
        meta["frames"][1]["transform_matrix"][0][3] = math.nan

    edit_transforms(scene, poison)
    with pytest.raises(BadInputError, match="NaN/Inf"):
        check_transforms_json(scene)


def test_good_scene_passes(scene):
    check_data_path(scene)
    check_transforms_json(scene)
    check_dataparser_outputs(parse(scene), "train")


@pytest.mark.parametrize("case", ["missing", "truncated"])
def test_ns_train_exits_with_message_and_leaves_no_run_folder(case, scene, tmp_path):
    data = tmp_path / "nope" if case == "missing" else scene
    if case == "truncated":
        image = first_image(scene)
        image.write_bytes(image.read_bytes()[:100])
    out = tmp_path / "out"
    proc = ns("ns-train", "bytesplat", "--data", str(data), "--machine.device-type", "cpu", "--output-dir", str(out),
              "--vis", "tensorboard", check=False, timeout=300)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert ("does not exist" if case == "missing" else "cannot be read") in proc.stdout
    assert "Traceback" not in proc.stderr
    assert not any(p.is_file() for p in out.rglob("*")), "a failed start left files behind"
