"""Splat PLY files: bytesplat's vectorised writer against nerfstudio's per-vertex loop (same bytes, same
errors), the reader's round trip, and the patch that puts the writer into `ns-export gaussian-splat`."""

from __future__ import annotations

import struct
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

# bytesplat_ns first: importing nerfstudio's exporter before bytesplat_ns currently fails (see the report).
from bytesplat_ns import nerfstudio_patches, splat_ply

SH_DEGREE = 3
NUM_SH_REST = (SH_DEGREE + 1) ** 2 - 1  # 15 coefficients per colour channel -> 45 f_rest fields
COUNTS = (1, 7, 2000)
SEED = 1234
EXPORTER_MODULE = "nerfstudio.scripts.exporter"
LOW_OPACITY_LOGIT = -5.5373  # the exporter drops splats below logit(1/255); keep test values above it

# Values whose float32 bit patterns must survive: NaN (with a payload), infinities, signed zeros, values out
# of float32's range or below its smallest subnormal, and a float64 that float32 must round.
SPECIAL_FLOAT64 = np.array(
    [
        np.nan,
        struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_DEAD_BEEF))[0],
        -np.nan,
        np.inf,
        -np.inf,
        -0.0,
        0.0,
        1e300,
        -1e300,
        1e-300,
        1e-45,
        np.nextafter(1.0, 2.0),
    ],
    dtype=np.float64,
)
SPECIAL_FLOAT32 = np.array(
    [
        np.nan,
        np.frombuffer(struct.pack("<I", 0x7FC0_1234), dtype="<f4")[0],  # quiet NaN with a payload
        np.frombuffer(struct.pack("<I", 0xFFC0_0001), dtype="<f4")[0],  # negative NaN with a payload
        np.inf,
        -np.inf,
        -0.0,
        np.finfo(np.float32).tiny / 4,  # subnormal
        np.finfo(np.float32).max,
    ],
    dtype=np.float32,
)


@pytest.fixture(scope="module")
def exporter():
    import importlib

    pytest.importorskip("open3d", reason="nerfstudio's exporter imports open3d when it loads")
    return importlib.import_module(EXPORTER_MODULE)


@pytest.fixture(scope="module")
def nerfstudio_write_ply(exporter):
    """nerfstudio's own writer, whether or not the patch has been applied in this process."""
    cls = exporter.ExportGaussianSplat
    original = getattr(cls, "nerfstudio_write_ply", cls.write_ply)
    assert original.__module__ == EXPORTER_MODULE
    return original


def sprinkle(array: np.ndarray, specials: np.ndarray, rng: np.random.Generator, fraction: float = 0.2) -> None:
    """Overwrite about `fraction` of `array` (in place) with values from `specials`."""
    flat = array.reshape(-1)
    picks = rng.random(flat.size) < fraction
    flat[picks] = rng.choice(specials, size=int(picks.sum()))


def splat_map(count: int, color_mode: str, seed: int = SEED) -> OrderedDict[str, np.ndarray]:
    """A map like ExportGaussianSplat.main builds (before its finite/opacity filter), with float64 and float32
    sources, (n,) and (n, 1) arrays, strided views, and non-finite values."""
    rng = np.random.default_rng(seed)
    positions = rng.normal(size=(count, 3))  # float64, as if the model ran in double precision
    sprinkle(positions, SPECIAL_FLOAT64, rng)
    out: OrderedDict[str, np.ndarray] = OrderedDict()
    out["x"], out["y"], out["z"] = positions[:, 0], positions[:, 1], positions[:, 2]
    for name in ("nx", "ny", "nz"):
        out[name] = np.zeros(count, dtype=np.float32)
    if color_mode == "rgb":
        colors = (np.clip(rng.random((count, 3), dtype=np.float32) * 1.2 - 0.1, 0, 1) * 255).astype(np.uint8)
        out["red"], out["green"], out["blue"] = colors[:, 0], colors[:, 1], colors[:, 2]
    else:
        shs_0 = rng.normal(size=(count, 3)).astype(np.float32)
        sprinkle(shs_0, SPECIAL_FLOAT32, rng)
        for i in range(shs_0.shape[1]):
            out[f"f_dc_{i}"] = shs_0[:, i, None]
        shs_rest = torch.from_numpy(rng.normal(size=(count, NUM_SH_REST, 3)))  # float64
        shs_rest = shs_rest.transpose(1, 2).contiguous().numpy().reshape((count, -1))
        sprinkle(shs_rest, SPECIAL_FLOAT64, rng, fraction=0.05)
        for i in range(shs_rest.shape[-1]):
            out[f"f_rest_{i}"] = shs_rest[:, i, None]
    out["opacity"] = rng.uniform(LOW_OPACITY_LOGIT, 5, size=(count, 1)).astype(np.float32)
    scales = rng.normal(-3, 1, size=(count, 3))  # float64
    sprinkle(scales, SPECIAL_FLOAT64, rng)
    for i in range(3):
        out[f"scale_{i}"] = scales[:, i, None]
    quats = rng.normal(size=(count, 4)).astype(np.float32)
    sprinkle(quats, SPECIAL_FLOAT32, rng)
    for i in range(4):
        out[f"rot_{i}"] = quats[:, i, None]
    return out


def write_both(tmp_path: Path, nerfstudio_write_ply, count, tensors) -> tuple[bytes, bytes]:
    theirs, ours = tmp_path / "nerfstudio.ply", tmp_path / "bytesplat.ply"
    nerfstudio_write_ply(str(theirs), count, tensors)
    splat_ply.write_ply(str(ours), count, tensors)
    return theirs.read_bytes(), ours.read_bytes()


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("color_mode", ["sh_coeffs", "rgb"])
def test_same_bytes_as_nerfstudio(tmp_path, nerfstudio_write_ply, color_mode, count):
    tensors = splat_map(count, color_mode)
    expected_fields = 62 if color_mode == "sh_coeffs" else 17
    assert len(tensors) == expected_fields
    with np.errstate(over="ignore", invalid="ignore"):  # float64 -> float32 overflow is part of the test
        theirs, ours = write_both(tmp_path, nerfstudio_write_ply, count, tensors)
    assert ours == theirs
    record = 4 * (expected_fields - (3 if color_mode == "rgb" else 0)) + (3 if color_mode == "rgb" else 0)
    assert len(ours) == ours.index(b"end_header\n") + len(b"end_header\n") + count * record


def test_same_bytes_for_other_float_dtypes_and_numpy_count(tmp_path, nerfstudio_write_ply):
    """float16 and big-endian float32 are floats too; the exporter passes `count` as a numpy integer after
    filtering."""
    rng = np.random.default_rng(SEED)
    count = 33
    tensors = OrderedDict(
        half=rng.normal(size=count).astype(np.float16),
        big_endian=rng.normal(size=(count, 1)).astype(">f4"),
        plain=rng.normal(size=count).astype(np.float32),
        uchar=rng.integers(0, 256, size=count, dtype=np.uint8),
    )
    theirs, ours = write_both(tmp_path, nerfstudio_write_ply, np.sum(np.ones(count, dtype=bool)), tensors)
    assert ours == theirs


def error_cases() -> dict[str, tuple[int, OrderedDict[str, np.ndarray]]]:
    n = 5
    good = np.zeros(n, dtype=np.float32)
    return {
        "count larger": (n + 1, OrderedDict(x=good, y=good)),
        "count smaller": (n - 1, OrderedDict(x=good, y=good)),
        "one array shorter": (n, OrderedDict(x=good, y=good[:-1])),
        "empty arrays": (0, OrderedDict(x=np.zeros(0, dtype=np.float32), y=np.zeros((0, 1), dtype=np.float32))),
        "int32 array": (n, OrderedDict(x=good, y=np.arange(n, dtype=np.int32))),
        "int64 array": (n, OrderedDict(x=np.arange(n), y=good)),
        "bool array": (n, OrderedDict(x=good, y=np.ones(n, dtype=bool))),
    }


@pytest.mark.parametrize("case", list(error_cases()))
def test_same_errors_as_nerfstudio(tmp_path, nerfstudio_write_ply, case):
    count, tensors = error_cases()[case]
    messages = []
    for name, writer in (("nerfstudio", nerfstudio_write_ply), ("bytesplat", splat_ply.write_ply)):
        path = tmp_path / f"{name}.ply"
        with pytest.raises(ValueError) as error:
            writer(str(path), count, tensors)
        messages.append(str(error.value))
        assert not path.exists()
    assert messages[0] == messages[1]


def splat_tensors(count: int, sh_degree: int, seed: int = SEED) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=generator)
    return {
        "means": randn(count, 3),
        "scales": randn(count, 3) - 3,
        "quats": randn(count, 4),
        "features_dc": randn(count, 3),
        "features_rest": randn(count, (sh_degree + 1) ** 2 - 1, 3),
        "opacities": randn(count, 1),
    }


def export_map(params: dict[str, torch.Tensor]) -> OrderedDict[str, np.ndarray]:
    """The sh_coeffs branch of ExportGaussianSplat.main, from a model's raw parameters."""
    positions = params["means"].numpy()
    n = positions.shape[0]
    out: OrderedDict[str, np.ndarray] = OrderedDict()
    out["x"], out["y"], out["z"] = positions[:, 0], positions[:, 1], positions[:, 2]
    for name in ("nx", "ny", "nz"):
        out[name] = np.zeros(n, dtype=np.float32)
    shs_0 = params["features_dc"].contiguous().numpy()
    for i in range(shs_0.shape[1]):
        out[f"f_dc_{i}"] = shs_0[:, i, None]
    if params["features_rest"].shape[1] > 0:
        shs_rest = params["features_rest"].transpose(1, 2).contiguous().numpy().reshape((n, -1))
        for i in range(shs_rest.shape[-1]):
            out[f"f_rest_{i}"] = shs_rest[:, i, None]
    out["opacity"] = params["opacities"].numpy()
    scales = params["scales"].numpy()
    for i in range(3):
        out[f"scale_{i}"] = scales[:, i, None]
    quats = params["quats"].numpy()
    for i in range(4):
        out[f"rot_{i}"] = quats[:, i, None]
    return out


@pytest.mark.parametrize("sh_degree", [0, 1, SH_DEGREE])
def test_read_splats_round_trip(tmp_path, sh_degree):
    count = 257
    params = splat_tensors(count, sh_degree)
    path = tmp_path / "splat.ply"
    splat_ply.write_ply(str(path), count, export_map(params))
    read = splat_ply.read_splats(path)
    assert set(read) == set(params)
    for name, expected in params.items():
        assert read[name].dtype == torch.float32, name
        assert read[name].shape == expected.shape, name
        assert torch.equal(read[name], expected), name


def test_read_splats_rejects_ply_without_splat_fields(tmp_path):
    count = 4
    rng = np.random.default_rng(SEED)
    point_cloud = OrderedDict((axis, rng.normal(size=count)) for axis in ("x", "y", "z"))
    point_cloud.update((c, rng.integers(0, 256, size=count, dtype=np.uint8)) for c in ("red", "green", "blue"))
    rgb_splats = splat_map(count, "rgb")  # ns-export's rgb mode has no f_dc_* fields
    for name, tensors in (("points", point_cloud), ("rgb", rgb_splats)):
        path = tmp_path / f"{name}.ply"
        with np.errstate(over="ignore", invalid="ignore"):
            splat_ply.write_ply(str(path), count, tensors)
        with pytest.raises(ValueError, match="not a Gaussian-splat PLY"):
            splat_ply.read_splats(path)


@pytest.fixture()
def restore_exporter_class(exporter):
    cls = exporter.ExportGaussianSplat
    saved = {name: cls.__dict__[name] for name in ("write_ply", "nerfstudio_write_ply") if name in cls.__dict__}
    yield cls
    for name in ("write_ply", "nerfstudio_write_ply"):
        if name in saved:
            setattr(cls, name, saved[name])
        elif name in cls.__dict__:
            delattr(cls, name)


def test_patch_ply_writer(exporter, nerfstudio_write_ply, restore_exporter_class, tmp_path):
    cls = restore_exporter_class
    for _ in range(2):  # patching twice must keep nerfstudio's writer, not save ours as the original
        nerfstudio_patches.patch_ply_writer(exporter)
        assert cls.write_ply is splat_ply.write_ply
        assert cls.nerfstudio_write_ply is nerfstudio_write_ply
        assert cls.nerfstudio_write_ply.__module__ == EXPORTER_MODULE
        assert cls.nerfstudio_write_ply.__qualname__ == "ExportGaussianSplat.write_ply"
    # main() calls ExportGaussianSplat.write_ply(filename, count, map) through the class
    tensors = splat_map(3, "sh_coeffs")
    with np.errstate(over="ignore", invalid="ignore"):
        cls.write_ply(str(tmp_path / "ours.ply"), 3, tensors)
        cls.nerfstudio_write_ply(str(tmp_path / "theirs.ply"), 3, tensors)
    assert (tmp_path / "ours.ply").read_bytes() == (tmp_path / "theirs.ply").read_bytes()
