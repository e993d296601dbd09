"""Two changes to nerfstudio's command-line tools, made when bytesplat is imported (nerfstudio imports
every registered method plugin when it starts, so they apply to ns-export and ns-render):

- `ns-export gaussian-splat` writes its PLY with bytesplat's vectorised writer (splat_ply.write_ply):
  the same bytes as nerfstudio's per-vertex Python loop, orders of magnitude faster for millions of splats.
- `ns-render interpolate|camera-path|spiral` without ffmpeg: instead of exiting, they write the frames
  as images and say so (with ffmpeg they write the video as before).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def install() -> None:
    from nerfstudio.utils import install_checks

    install_checks.check_ffmpeg_installed = _check_ffmpeg_or_write_frames
    patch_loaded_exporter()


def patch_loaded_exporter() -> None:
    """Patch ns-export's writer once its module has finished loading. ns-export imports plugins (so bytesplat)
    halfway through loading itself, so this runs again when a ByteSplat model is built, before anything is written."""
    exporter = sys.modules.get("nerfstudio.scripts.exporter")
    if exporter is not None and hasattr(exporter, "ExportGaussianSplat"):
        patch_ply_writer(exporter)


def patch_ply_writer(exporter) -> None:
    """Swap ExportGaussianSplat.write_ply for the vectorised writer; the original stays as `nerfstudio_write_ply`."""
    from bytesplat_ns.splat_ply import write_ply

    cls = exporter.ExportGaussianSplat
    if not hasattr(cls, "nerfstudio_write_ply"):
        cls.nerfstudio_write_ply = staticmethod(cls.write_ply)
    cls.write_ply = staticmethod(write_ply)


def _check_ffmpeg_or_write_frames() -> None:
    if shutil.which("ffmpeg") is not None:
        return
    from nerfstudio.utils.rich_utils import CONSOLE

    render = sys.modules["nerfstudio.scripts.render"]
    original = render._render_trajectory_video

    def render_frames(pipeline, cameras, output_filename: Path, *args, **kwargs):
        if kwargs.get("output_format", "video") == "video":
            output_filename = Path(output_filename).with_suffix("")
            kwargs["output_format"] = "images"
            CONSOLE.print(f"[bold yellow]ffmpeg not found: writing frames to {output_filename}/ instead of a video.")
        return original(pipeline, cameras, output_filename, *args, **kwargs)

    render._render_trajectory_video = render_frames
