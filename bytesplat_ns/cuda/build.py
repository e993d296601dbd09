"""Lazy build of the CUDA extension in csrc/ with torch.utils.cpp_extension, cached by a hash of the sources.

Nothing here runs at import. `load()` returns the extension module, in this order:
  1. fails with the fix named when torch is CPU-only or no CUDA device is visible;
  2. loads a prebuilt `bytesplat_cuda_<hash>.so` from the cache folder (no nvcc needed), where the hash covers
     every file in csrc/, the build flags, and torch's and CUDA's versions: a changed source never loads a
     stale build;
  3. otherwise needs nvcc (failing with the fix named when it is missing) and builds into the cache folder.

The cache folder is $BYTESPLAT_EXT_DIR when set (carry a built .so between machines by copying it into such
a folder), else ~/.cache/bytesplat/ext. TORCH_CUDA_ARCH_LIST and MAX_JOBS work as in torch's own builds.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
from pathlib import Path
from types import ModuleType

import torch

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCE_SUFFIXES = (".h", ".cuh", ".cpp", ".cu")
EXTRA_CFLAGS = ["-O3"]
EXTRA_CUDA_CFLAGS = ["-O3", "-lineinfo"]  # no fast math: the kernels match the reference to 1e-4
ENV_DIR = "BYTESPLAT_EXT_DIR"
WITHOUT_KERNELS = (
    "Or train without bytesplat's kernels: --pipeline.model.renderer gsplat --pipeline.model.ssim-kernel False "
    "(with several GPUs also --pipeline.exchange-kernels False)."
)
NAME_PREFIX = "bytesplat_cuda_"


class FusedBuildError(RuntimeError):
    """The fused kernels cannot be built or loaded here; the message names the fix."""


def source_files() -> list[Path]:
    """Every file of the extension's sources, in a stable order."""
    return sorted(p for p in CSRC.iterdir() if p.suffix in SOURCE_SUFFIXES)


def source_hash(files: list[Path] | None = None) -> str:
    """16 hex digits over the sources' names and bytes, the build flags, and torch's and CUDA's versions."""
    digest = hashlib.sha256()
    for path in source_files() if files is None else files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(repr((EXTRA_CFLAGS, EXTRA_CUDA_CFLAGS, torch.__version__, torch.version.cuda)).encode())
    return digest.hexdigest()[:16]


def module_name() -> str:
    return NAME_PREFIX + source_hash()


def cache_dir() -> Path:
    env = os.environ.get(ENV_DIR)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "bytesplat" / "ext"


def prebuilt_path(name: str) -> Path | None:
    """A built module for exactly these sources: flat in the cache folder (carried) or in its build folder."""
    for candidate in (cache_dir() / f"{name}.so", cache_dir() / name / f"{name}.so"):
        if candidate.is_file():
            return candidate
    return None


def is_loaded() -> bool:
    return load.cache_info().currsize > 0


@functools.cache
def load() -> ModuleType:
    """The extension module: loaded from the cache, or built there first."""
    _check_torch_and_device()
    name = module_name()
    path = prebuilt_path(name)
    if path is not None:
        return _load_file(name, path)
    nvcc = _find_nvcc()
    if nvcc is None:
        raise FusedBuildError(
            f"The fused renderer must compile its CUDA kernels, but nvcc was not found (CUDA_HOME="
            f"{os.environ.get('CUDA_HOME')!r}). Install the CUDA toolkit {torch.version.cuda} (matching torch's CUDA) "
            f"and put its bin/ on PATH or set CUDA_HOME, or set {ENV_DIR} to a folder holding a prebuilt {name}.so. "
            + WITHOUT_KERNELS
        )
    from torch.utils.cpp_extension import load as cpp_load

    build_dir = cache_dir() / name
    build_dir.mkdir(parents=True, exist_ok=True)
    sources = [str(p) for p in source_files() if p.suffix in (".cpp", ".cu")]
    try:
        return cpp_load(
            name=name,
            sources=sources,
            extra_cflags=EXTRA_CFLAGS,
            extra_cuda_cflags=EXTRA_CUDA_CFLAGS,
            build_directory=str(build_dir),
            verbose=bool(os.environ.get("BYTESPLAT_BUILD_VERBOSE")),
        )
    except (RuntimeError, OSError) as error:
        raise FusedBuildError(
            f"Building the fused CUDA kernels in {build_dir} failed with nvcc {nvcc}: {error}. "
            "Set BYTESPLAT_BUILD_VERBOSE=1 to see the compiler's output. " + WITHOUT_KERNELS
        ) from error


def _check_torch_and_device() -> None:
    if _torch_cuda_version() is None:
        raise FusedBuildError(
            f"The fused renderer needs a CUDA build of torch; this torch ({torch.__version__}) is CPU-only. "
            "Install a CUDA build of torch (pip install torch from the CUDA wheel index), or use "
            "--pipeline.model.renderer torch on CPU."
        )
    if not _cuda_available():
        raise FusedBuildError(
            "The fused renderer needs a CUDA GPU, and torch sees none (torch.cuda.is_available() is False). "
            "Check the NVIDIA driver and CUDA_VISIBLE_DEVICES, or use --pipeline.model.renderer torch on CPU."
        )


def _torch_cuda_version() -> str | None:
    return torch.version.cuda


def _cuda_available() -> bool:
    return torch.cuda.is_available()


def _find_nvcc() -> str | None:
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME is not None and (Path(CUDA_HOME) / "bin" / "nvcc").is_file():
        return str(Path(CUDA_HOME) / "bin" / "nvcc")
    return shutil.which("nvcc")


def _load_file(name: str, path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    if spec is None:
        raise FusedBuildError(f"Cannot load the prebuilt fused kernels at {path}; delete it to rebuild.")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
