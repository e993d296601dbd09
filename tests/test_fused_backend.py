"""The `fused` renderer backend (our CUDA kernels) against the PyTorch reference.

CPU (CI): the lazy loader's errors and cache key, and every csrc/ source compiled (nvcc for .cu, the host
compiler against torch's headers for .cpp) without running anything.

GPU: the kernels on random 2D splats against `torch_backend.composite` in float64, fed the very same float32
numbers and the same tile lists, so only the compositing itself is compared. Scenes of several sizes, image
sizes that are not multiples of 16, empty tiles, a single splat, tiles longer than the on-chip capacity
(pruning off: chunked), and pruning on. Outputs are poisoned with NaN before each run. Checked: image and
alpha within IMAGE_ATOL, every gradient within GRAD_RTOL norm-wise, no NaN, for the autograd path and for the
fused loss path (L1 + L2 + D-SSIM) against torch autograd of the same loss. Then the whole backend against the
gsplat backend (same projection) and `fused_loss_step` against autograd through `rasterize(backend="fused")`.

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
BACKGROUND = (0.25, 0.5, 0.75)
CASES = {
    # name: (splats, width, height, seed, placement)
    "n200-64x48": (200, 64, 48, 1, "spread"),
    "n2000-200x150": (2000, 200, 150, 2, "spread"),
    "n3000-37x23": (3000, 37, 23, 3, "spread"),
    "n20000-203x157": (20000, 203, 157, 4, "spread"),
    "n500-96x64-empty-tiles": (500, 96, 64, 5, "left"),
    "n1-17x33-single": (1, 17, 33, 6, "spread"),
}
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused kernels need a CUDA GPU")


# ----------------------------------------------------------------------------------------------
# CPU: loader and sources
# ----------------------------------------------------------------------------------------------


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
    assert len(list(tmp_path.glob("*.o"))) == len(sources) == 7


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
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("capacity", ["device", SMALL_CAPACITY])
def test_autograd_path_matches_reference(name, capacity):
    count, width, height, seed, placement = CASES[name]
    scene = fc.random_2d_scene(count, width, height, seed, placement, channels=4)
    fc.check_autograd_path(scene, capacity, fc.tolerances(IMAGE_ATOL, GRAD_RTOL, CUTOFF_SHIFT, FLIPPED_FRACTION,
                                                          FLIPPED_ATOL))  # fmt: skip


@gpu
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("ssim", [0.0, 0.2])
def test_loss_path_matches_reference(name, ssim):
    count, width, height, seed, placement = CASES[name]
    scene = fc.random_2d_scene(count, width, height, seed + 100, placement, channels=3)
    weights = dict(l1=1.0 - ssim, l2=0.3, ssim=ssim)
    fc.check_loss_path(scene, weights, BACKGROUND, LOSS_RTOL, fc.tolerances(IMAGE_ATOL, GRAD_RTOL, CUTOFF_SHIFT,
                                                                          FLIPPED_FRACTION, FLIPPED_ATOL))  # fmt: skip


@gpu
def test_tiles_beyond_device_capacity_without_pruning():
    scene = fc.overflowing_scene(seed=7, width=40, height=24)
    capacity = fc.device_capacity(4)
    assert int(scene.bins.counts.max()) > capacity, "the scene must overflow the on-chip capacity"
    fc.check_autograd_path(scene, "device", fc.tolerances(IMAGE_ATOL, GRAD_RTOL, CUTOFF_SHIFT, FLIPPED_FRACTION,
                                                          FLIPPED_ATOL))  # fmt: skip


@gpu
def test_pruning_keeps_the_strongest_in_depth_order():
    scene = fc.random_2d_scene(5000, 96, 80, 8, "spread", channels=3)
    fc.check_pruning(scene, SMALL_CAPACITY, SCORE_RTOL)


@gpu
def test_backend_matches_gsplat_backend():
    fc.check_backend_against_gsplat(seed=9, image_atol=IMAGE_ATOL, grad_rtol=GRAD_RTOL)


@gpu
def test_fused_loss_step_matches_autograd_through_rasterize():
    fc.check_fused_loss_step(seed=10, grad_rtol=GRAD_RTOL, loss_rtol=LOSS_RTOL)


@gpu
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("mode", ["exact", "spare", "short"])
def test_binning_matches_gsplat(name, mode):
    count, width, height, seed, placement = CASES[name]
    fc.check_binning(fc.random_2d_scene(count, width, height, seed + 200, placement, channels=3), mode)


@gpu
def test_training_binning_needs_no_count_and_counts_overflows():
    fc.check_bin_capacity_renders(seed=11)


@gpu
def test_capacity_is_read_from_the_device_at_run_time():
    rgb, rgbd = fc.device_capacity(3), fc.device_capacity(4)
    assert 256 <= rgbd < rgb, (rgb, rgbd)  # 40 and 44 bytes per splat on-chip
