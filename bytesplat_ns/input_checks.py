"""Checks of the user's scene before training: each failure names the problem and the fix.

`BadInputError` carries that message; the trainer prints it (no traceback), removes the run folder it
had just created, and exits with status 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from nerfstudio.data.dataparsers.base_dataparser import DataparserOutputs
from PIL import Image, UnidentifiedImageError

MIN_TRAIN_IMAGES = 2


class BadInputError(ValueError):
    """The scene cannot be trained on; the message says why and what to do."""


def check_data_path(data: Path | None) -> None:
    """--data exists and is not empty."""
    if data is None:
        raise BadInputError("No scene given. Pass --data <folder with transforms.json, or a colmap/blender scene>.")
    if not data.exists():
        raise BadInputError(
            f"--data {data} does not exist. Check the path (relative paths start at the current folder)."
        )
    if data.is_dir() and not any(data.iterdir()):
        raise BadInputError(f"--data {data} is an empty folder. Point it at a prepared scene (see ns-process-data).")


def check_transforms_json(data: Path) -> None:
    """A nerfstudio-data scene: transforms.json parses, names >= 2 frames with finite poses and existing files."""
    path = data if data.suffix == ".json" else data / "transforms.json"
    if not path.exists():
        found = (
            "transforms_train.json (a Blender scene: add the subcommand blender-data)"
            if (data / "transforms_train.json").exists()
            else "no transforms.json"
        )
        raise BadInputError(
            f"--data {data}: {found}. bytesplat's default reader takes nerfstudio-data (transforms.json); for other "
            "formats add a dataparser subcommand (colmap, blender-data, ...) or convert with ns-process-data."
        )
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise BadInputError(f"{path} is not valid JSON ({error}). Regenerate it with ns-process-data.") from None
    frames = meta.get("frames") if isinstance(meta, dict) else None
    if not frames:
        raise BadInputError(f'{path} lists no frames. A scene needs posed images under "frames".')
    if len(frames) < MIN_TRAIN_IMAGES:
        raise BadInputError(f"{path} lists a single image; training needs at least {MIN_TRAIN_IMAGES} posed images.")
    for i, frame in enumerate(frames):
        matrix = np.asarray(frame.get("transform_matrix", []), dtype=np.float64)
        if matrix.shape != (4, 4) or not np.isfinite(matrix).all():
            raise BadInputError(
                f"{path}: frame {i} ({frame.get('file_path')}) has a camera pose with NaN/Inf or not 4x4. "
                "Fix or drop that frame (re-run the pose estimation)."
            )
        image = path.parent / frame.get("file_path", "")
        if not image.is_file():
            raise BadInputError(f"{path}: frame {i} names {image}, which does not exist. Restore it or drop the frame.")


def check_dataparser_outputs(outputs: DataparserOutputs, split: str) -> None:
    """Every image exists and decodes completely, its size matches its camera, and every pose is finite."""
    cameras, files = outputs.cameras, outputs.image_filenames
    if split == "train" and len(files) < MIN_TRAIN_IMAGES:
        raise BadInputError(
            f"The {split} split has {len(files)} image(s); training needs at least {MIN_TRAIN_IMAGES}. "
            "Add images or change the split (e.g. --eval-mode)."
        )
    poses = cameras.camera_to_worlds.numpy()
    for i, name in enumerate(files):
        if not np.isfinite(poses[i]).all():
            raise BadInputError(f"Camera {i} ({name}) has a pose with NaN/Inf. Fix or drop that image's pose.")
        size = _decoded_size(Path(name))
        expected = (int(cameras.width[i]), int(cameras.height[i]))
        if size != expected:
            raise BadInputError(
                f"{name} is {size[0]}x{size[1]} pixels but its camera intrinsics say {expected[0]}x{expected[1]}. "
                "Fix w/h (and fl_x, cx, ...) in the scene's camera file, or resize the image."
            )


def _decoded_size(path: Path) -> tuple[int, int]:
    if not path.is_file():
        raise BadInputError(f"Image {path} is missing. Restore it or remove it from the scene.")
    try:
        with Image.open(path) as image:
            image.load()  # decodes every byte: a truncated file fails here, not mid-training
            return image.size
    except (OSError, UnidentifiedImageError, SyntaxError) as error:
        raise BadInputError(
            f"Image {path} cannot be read ({error}). Replace the file or remove it from the scene."
        ) from None
