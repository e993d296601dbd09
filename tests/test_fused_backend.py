"""The `fused` renderer backend (our CUDA kernels) against the PyTorch reference.

CPU (CI): the lazy loader's errors and cache key, and every csrc/ source compiled (nvcc for .cu, the host
compiler against torch's headers for .cpp) without running anything.

CPU: also the rule that picks 8-pixel tiles for images with fewer 16-pixel tiles than two waves of blocks.

GPU: the kernels on random 2D splats against `torch_backend.composite` in float64, fed the very same float32
numbers and the same tile lists, so only the compositing itself is compared, on 16- and 8-pixel tiles
(TILE_SIZES: every comparison runs on both). Scenes of several sizes, image sizes that are not multiples of the
tile, empty tiles, a single splat, long thin splats of barely visible opacity, tiles longer than the on-chip
capacity (pruning off: chunked), and pruning on. Outputs are poisoned with NaN before each run. Checked: image
and alpha within IMAGE_ATOL, every gradient within GRAD_RTOL norm-wise, no NaN, for the autograd path and for the
fused loss path (L1 + L2 + D-SSIM, whose backward resumes from the forward kernel's kept state, also over
chunked tiles) against torch autograd of the same loss. Then the whole backend against the
gsplat backend (same projection, same tile side) and `fused_loss_step` against autograd through
`rasterize(backend="fused")`.

Per-pixel cut-offs (alpha >= 1/255, transmittance > 1e-4) are discrete: float32 and float64 may decide a
(pixel, splat) pair differently when it sits within rounding of a cut-off. Such pixels are found by rendering the
reference with both cut-offs moved by CUTOFF_SHIFT (relative) down and up; pixels that change are compared only
to FLIPPED_ATOL, and they must stay rare (FLIPPED_FRACTION).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import torch.utils.cpp_extension

from bytesplat_ns.cuda import build

IMAGE_ATOL = 1e-4
GRAD_RTOL = 1e-3
LOSS_RTOL = 1e-4
CUTOFF_SHIFT = 1e-4
FLIPPED_FRACTION = 0.02
FLIPPED_ATOL = 0.02
SCORE_RTOL = 1e-4
SMALL_CAPACITY = 64
UNALIGNED_CAPACITY = 40
BACKGROUND = (0.25, 0.5, 0.75)
CASES = {
    # name: (splats, width, height, seed, placement)
    "n200-64x48": (200, 64, 48, 1, "spread"),
    "n2000-200x150": (2000, 200, 150, 2, "spread"),
    "n3000-37x23": (3000, 37, 23, 3, "spread"),
    "n20000-203x157": (20000, 203, 157, 4, "spread"),
    "n500-96x64-empty-tiles": (500, 96, 64, 5, "left"),
    "n1-17x33-single": (1, 17, 33, 6, "spread"),
    "n3000-120x90-needles": (3000, 120, 90, 11, "needles"),
}
TILE_SIZES = [16, 8]
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused kernels need a CUDA GPU")


# ----------------------------------------------------------------------------------------------
# CPU: loader and sources
# ----------------------------------------------------------------------------------------------


def test_smaller_images_get_8_pixel_tiles(monkeypatch):
    """8-pixel tiles exactly when the image has fewer 16-pixel tiles than two waves of fused-kernel blocks: 2 x 4
    blocks per SM x 132 SMs on the H200 = 1056."""
    from bytesplat_ns.cuda import ops

    monkeypatch.setattr(ops, "sm_count", lambda index: 132)
    cuda = torch.device("cuda", 0)
    assert ops.tile_size_for(100, 100, cuda) == ops.SMALL_TILE_SIZE == 8  # lego-400 at a quarter: 7x7 = 49 tiles
    assert ops.tile_size_for(200, 200, cuda) == 8  # 13x13 = 169
    assert ops.tile_size_for(400, 400, cuda) == 8  # 25x25 = 625
    assert ops.tile_size_for(800, 800, cuda) == ops.TILE_SIZE == 16  # 50x50 = 2500
    assert ops.tile_size_for(1920, 1080, cuda) == 16
    assert ops.tile_size_for(33 * 16, 32 * 16, cuda) == 16  # 1056 tiles: not fewer than two waves
    assert ops.tile_size_for(32 * 16 + 1, 33 * 16, cuda) == 16  # a partial tile counts: 33x33
    assert ops.tile_size_for(32 * 16, 32 * 16, cuda) == 8  # 1024
    assert ops.tile_size_for(1055 * 16, 1, cuda) == 8
    assert ops.tile_size_for(1, 1, cuda) == 8
    monkeypatch.setattr(ops, "sm_count", lambda index: 0)  # no SM: never fewer tiles than that
    assert ops.tile_size_for(1, 1, cuda) == 16


def test_the_sm_count_is_read_once_per_device(monkeypatch):
    from bytesplat_ns.cuda import ops

    reads = []

    def properties(index):
        reads.append(index)
        return type("Properties", (), {"multi_processor_count": 132})()

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    ops.sm_count.cache_clear()
    try:
        assert ops.sm_count(0) == ops.sm_count(0) == 132 and ops.sm_count(1) == 132
        assert reads == [0, 1]
    finally:
        ops.sm_count.cache_clear()


def test_importing_compiles_nothing():
    code = (
        "import bytesplat_ns.render, bytesplat_ns.render.fused_backend, bytesplat_ns.cuda.ops\n"
        "from bytesplat_ns.cuda import build\n"
        "assert not build.is_loaded()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_loader_errors_name_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv(build.ENV_DIR, str(tmp_path))
    load = build.load.__wrapped__  # bypass the cache
    monkeypatch.setattr(build, "_torch_cuda_version", lambda: None)
    with pytest.raises(build.FusedBuildError, match="needs a CUDA build of torch"):
        load()
    monkeypatch.setattr(build, "_torch_cuda_version", lambda: "13.0")
    monkeypatch.setattr(build, "_cuda_available", lambda: False)
    with pytest.raises(build.FusedBuildError, match="needs a CUDA GPU.*renderer torch"):
        load()
    monkeypatch.setattr(build, "_cuda_available", lambda: True)
    monkeypatch.setattr(build, "_find_nvcc", lambda: None)
    with pytest.raises(build.FusedBuildError, match="nvcc was not found") as error:
        load()
    message = str(error.value)
    assert "CUDA_HOME" in message and build.ENV_DIR in message and f"{build.module_name()}.so" in message
    assert "--pipeline.model.renderer gsplat --pipeline.model.ssim-kernel False" in message  # the way around


def test_prebuilt_module_is_found_in_the_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv(build.ENV_DIR, str(tmp_path))
    name = build.module_name()
    assert build.prebuilt_path(name) is None
    (tmp_path / f"{name}.so").write_bytes(b"")
    assert build.prebuilt_path(name) == tmp_path / f"{name}.so"
    assert build.prebuilt_path(build.NAME_PREFIX + "0" * 16) is None  # another source hash: not this build


def test_source_hash_follows_every_source(tmp_path):
    copies = []
    for path in build.source_files():
        copy = tmp_path / path.name
        copy.write_bytes(path.read_bytes())
        copies.append(copy)
    assert {p.suffix for p in copies} == {".h", ".cuh", ".cpp", ".cu"}
    assert build.source_hash(copies) == build.source_hash()
    for copy in copies:
        original = copy.read_bytes()
        copy.write_bytes(original + b"\n// changed\n")
        assert build.source_hash(copies) != build.source_hash(), copy.name
        copy.write_bytes(original)


def _nvcc() -> str | None:
    return shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if Path(p).is_file()), None)


def _cuda_include() -> Path | None:
    nvcc = _nvcc()
    roots = [os.environ.get("CUDA_HOME"), "/usr/local/cuda", nvcc and str(Path(nvcc).resolve().parent.parent)]
    return next(
        (Path(r) / "include" for r in roots if r and (Path(r) / "include" / "cuda_runtime_api.h").is_file()), None
    )


def _run_all(jobs: list[list[str]]) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda cmd: subprocess.run(cmd, capture_output=True, text=True, timeout=300), jobs))
    for cmd, result in zip(jobs, results):
        assert result.returncode == 0 and "warning" not in result.stderr, f"{cmd[-1]}:\n{result.stderr}"


@pytest.mark.skipif(_nvcc() is None, reason="nvcc is not installed; CI's CPU machine has it")
def test_cuda_sources_compile(tmp_path):
    sources = sorted(build.CSRC.glob("*.cu"))
    _run_all([
        [_nvcc(), "-c", "-std=c++17", "-arch=sm_90", "-O3", "-Xcompiler=-Wall,-Wextra", "-Werror=all-warnings",
         str(src), "-o", str(tmp_path / f"{src.stem}.o")]
        for src in sources
    ])  # fmt: skip
    assert len(list(tmp_path.glob("*.o"))) == len(sources) == 10


@pytest.mark.skipif(shutil.which("g++") is None or _cuda_include() is None, reason="needs g++ and the CUDA headers")
def test_host_sources_compile(tmp_path):
    """The torch glue (.cpp) against torch's headers, as torch.utils.cpp_extension builds it (C++20); one
    translation unit including every .cpp, so torch's headers are parsed once."""
    unit = tmp_path / "all_host_sources.cpp"
    unit.write_text("".join(f'#include "{src}"\n' for src in sorted(build.CSRC.glob("*.cpp"))))
    includes = [*torch.utils.cpp_extension.include_paths(), str(_cuda_include()), sysconfig.get_paths()["include"]]
    flags = ["-std=c++20", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-DTORCH_EXTENSION_NAME=bytesplat_check"]
    _run_all([["g++", *flags, *(f"-isystem{p}" for p in includes), str(unit)]])


# ----------------------------------------------------------------------------------------------
# GPU: kernels against the reference on the same projected splats
# ----------------------------------------------------------------------------------------------

if torch.cuda.is_available():  # the GPU helpers live in their own module, imported only where they can run
    from tests import fused_cases as fc


@gpu
@pytest.mark.parametrize("tile_size", TILE_SIZES)
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("capacity", ["device", SMALL_CAPACITY])
def test_autograd_path_matches_reference(name, capacity, tile_size):
    count, width, height, seed, placement = CASES[name]
    scene = fc.random_2d_scene(count, width, height, seed, placement, channels=4, tile_size=tile_size)
    fc.check_autograd_path(scene, capacity, fc.tolerances(IMAGE_ATOL, GRAD_RTOL, CUTOFF_SHIFT, FLIPPED_FRACTION,
                                                          FLIPPED_ATOL))  # fmt: skip


@gpu
@pytest.mark.parametrize("tile_size", TILE_SIZES)
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("ssim", [0.0, 0.2])
def test_loss_path_matches_reference(name, ssim, tile_size):
    count, width, height, seed, placement = CASES[name]
    scene = fc.random_2d_scene(count, width, height, seed + 100, placement, channels=3, tile_size=tile_size)
    weights = dict(l1=1.0 - ssim, l2=0.3, ssim=ssim)
    fc.check_loss_path(scene, weights, BACKGROUND, LOSS_RTOL, fc.tolerances(IMAGE_ATOL, GRAD_RTOL, CUTOFF_SHIFT,
                                                                          FLIPPED_FRACTION, FLIPPED_ATOL))  # fmt: skip


@gpu
@pytest.mark.parametrize("factor", [2.5, -0.5])
def test_loss_path_gradients_follow_the_loss_scale(factor):
    scene = fc.random_2d_scene(3000, 120, 90, 12, "spread", channels=3)
    fc.check_loss_scale(scene, factor)


@gpu
@pytest.mark.parametrize("tile_size", TILE_SIZES)
def test_tiles_beyond_device_capacity_without_pruning(tile_size):
    scene = fc.overflowing_scene(seed=7, width=40, height=24, tile_size=tile_size)
    capacity = fc.device_capacity(4, tile_size)
    assert int(scene.bins.counts.max()) > capacity, "the scene must overflow the on-chip capacity"
    deepest = fc.deepest_used_entry(scene, fc.lists_from_bins(scene.bins, tile_size))
    assert deepest >= capacity, f"pixels must use splats past the first chunk ({deepest} < {capacity})"
    fc.check_autograd_path(scene, "device", fc.tolerances(IMAGE_ATOL, GRAD_RTOL, CUTOFF_SHIFT, FLIPPED_FRACTION,
                                                          FLIPPED_ATOL))  # fmt: skip


@gpu
@pytest.mark.parametrize("tile_size", TILE_SIZES)
@pytest.mark.parametrize("capacity", ["device", UNALIGNED_CAPACITY])
def test_resumed_loss_path_over_chunked_tiles(tile_size, capacity):
    """With D-SSIM the loss path's backward resumes from the forward kernel's kept state; over lists longer than
    the capacity (pruning off), chunks start at entries that are not multiples of 32, where each chunk's bits
    are spliced from two of the forward's words."""
    scene = fc.overflowing_scene(seed=13, width=40, height=24, tile_size=tile_size, channels=3)
    size = fc.device_capacity(3, tile_size) if capacity == "device" else capacity
    assert size % 32 != 0, "the chunks must start off the forward's 32-entry words"
    deepest = fc.deepest_used_entry(scene, fc.lists_from_bins(scene.bins, tile_size))
    assert deepest >= size, f"pixels must use splats past the first chunk ({deepest} < {size})"
    fc.check_loss_path(scene, dict(l1=0.8, l2=0.3, ssim=0.2), BACKGROUND, LOSS_RTOL,
                       fc.tolerances(IMAGE_ATOL, GRAD_RTOL, CUTOFF_SHIFT, FLIPPED_FRACTION, FLIPPED_ATOL),
                       capacity=capacity)  # fmt: skip


@gpu
def test_resuming_excludes_a_second_image():
    from bytesplat_ns.cuda import ops

    scene = fc.random_2d_scene(200, 64, 48, 1, "spread", channels=3)
    lists = fc.lists_from_bins(scene.bins, 16)
    splats = (scene.means2d, scene.conics, scene.colors, scene.opacities)
    _, _, state = ops.render_pixels(*splats, lists, 64, 48, keep=True)
    gt = torch.zeros(48, 64, 3, device="cuda")
    with pytest.raises(ValueError, match="want_image with resume"):
        ops.loss_pixels(*splats, lists, gt, None, ops.LossWeights(), fc.device_capacity(3, 16), want_image=True,
                        resume=state)  # fmt: skip


@gpu
@pytest.mark.parametrize("tile_size", TILE_SIZES)
def test_pruning_keeps_the_strongest_in_depth_order(tile_size):
    scene = fc.random_2d_scene(5000, 96, 80, 8, "spread", channels=3, tile_size=tile_size)
    fc.check_pruning(scene, SMALL_CAPACITY, SCORE_RTOL)


@gpu
@pytest.mark.parametrize("tile_size", TILE_SIZES)
def test_backend_matches_gsplat_backend(tile_size):
    fc.check_backend_against_gsplat(seed=9, image_atol=IMAGE_ATOL, grad_rtol=GRAD_RTOL, tile_size=tile_size)


@gpu
@pytest.mark.parametrize("tile_size", TILE_SIZES)
def test_fused_loss_step_matches_autograd_through_rasterize(tile_size):
    fc.check_fused_loss_step(seed=10, grad_rtol=GRAD_RTOL, loss_rtol=LOSS_RTOL, tile_size=tile_size)


@gpu
@pytest.mark.parametrize("tile_size", TILE_SIZES)
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("mode", ["exact", "spare", "short"])
def test_binning_matches_gsplat(name, mode, tile_size):
    count, width, height, seed, placement = CASES[name]
    scene = fc.random_2d_scene(count, width, height, seed + 200, placement, channels=3, tile_size=tile_size)
    fc.check_binning(scene, mode)


@gpu
@pytest.mark.parametrize("tile_size", TILE_SIZES)
def test_training_binning_needs_no_count_and_counts_overflows(tile_size):
    fc.check_bin_capacity_renders(seed=11, tile_size=tile_size)


@gpu
def test_the_backend_picks_the_tile_side_by_image_size():
    fc.check_backend_tile_side(seed=12)


@gpu
def test_the_kernels_take_16_or_8_pixel_tiles_only():
    from bytesplat_ns.cuda import ops

    scene = fc.random_2d_scene(200, 64, 48, 1, "spread", channels=3)
    lists = fc.lists_from_bins(scene.bins, 16)
    splats = (scene.means2d, scene.conics, scene.colors, scene.opacities)
    with pytest.raises(RuntimeError, match="tile_size must be 16 or 8"):
        ops.ext().rasterize_forward(*splats, lists.start, lists.end, lists.ids, 64, 48, 2, 32, False, False)
    with pytest.raises(RuntimeError, match="tiles_x = 4 does not match width 64 with 8-pixel tiles"):
        ops.ext().rasterize_forward(*splats, lists.start, lists.end, lists.ids, 64, 48, 4, 8, False, False)
    lists.tile_size = 32
    with pytest.raises(ValueError, match="tiles of 32 pixels; the kernels take 16 or 8"):
        ops.render_pixels(*splats, lists, 64, 48)


@gpu
@pytest.mark.parametrize("tile_size", TILE_SIZES)
def test_capacity_is_read_from_the_device_at_run_time(tile_size):
    rgb, rgbd = fc.device_capacity(3, tile_size), fc.device_capacity(4, tile_size)
    assert 256 <= rgbd < rgb, (rgb, rgbd)  # 40 and 44 bytes per splat on-chip
    # the same shared memory per block on either side; an 8-pixel tile's block keeps less of it fixed
    assert fc.device_capacity(3, 8) > fc.device_capacity(3, 16) and fc.device_capacity(4, 8) > fc.device_capacity(4, 16)
