"""Three changes to nerfstudio's command-line tools, made when bytesplat is imported (nerfstudio imports
every registered method plugin when it starts, so they apply to ns-train, ns-export and ns-render):

- `ns-export gaussian-splat` writes its PLY with bytesplat's vectorised writer (splat_ply.write_ply):
  the same bytes as nerfstudio's per-vertex Python loop, orders of magnitude faster for millions of splats.
- `ns-render interpolate|camera-path|spiral` without ffmpeg: instead of exiting, they write the frames
  as images and say so (with ffmpeg they write the video as before).
- Start-up: when a tool starts, nerfstudio makes a placeholder config for each of the 26 external methods it
  lists, and each placeholder calls `inspect.stack()` to see which function made it. That call reads the source
  file of every frame on the stack, and takes 2-3 s of each start (benchmarks/RESULTS.md, twelfth session). The
  placeholder reads only the function names, so its module gets an `inspect` whose stack() gives just those.
"""

from __future__ import annotations

import inspect
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace


def install() -> None:
    from nerfstudio.utils import install_checks

    install_checks.check_ffmpeg_installed = _check_ffmpeg_or_write_frames
    patch_loaded_exporter()
    quicken_external_methods()


def quicken_external_methods() -> None:
    """Give nerfstudio's external-method list the cheap stack, once its module is loaded: nerfstudio loads it, then
    the plugins (so bytesplat's method configs call this again), then makes the placeholders."""
    external_methods = sys.modules.get("nerfstudio.configs.external_methods")
    if external_methods is not None:
        external_methods.inspect = StackNamesOnly()


class StackNamesOnly:
    """The inspect module, but for stack(): the caller's frames outwards with their function names only (no source
    read), which is all nerfstudio's external-method placeholder looks at."""

    def __getattr__(self, name: str):
        return getattr(inspect, name)

    @staticmethod
    def stack(context: int = 1) -> list[SimpleNamespace]:
        frame, frames = sys._getframe(1), []
        while frame is not None:
            frames.append(SimpleNamespace(function=frame.f_code.co_name))
            frame = frame.f_back
        return frames


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
